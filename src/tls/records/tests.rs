//! The record layer against rustls's own connections, over real TCP on loopback.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use ring::{aead, hkdf};

use super::handshake::Bounded;
use super::keys::TrafficSecret;
use super::*;
use crate::ca::material::{Material, key_to_pem};
use crate::ca::{CertTtl, CertificateAuthority, Identity, csr};

/// meshd's serving config, and a client config presenting a workload certificate of
/// namespace `shop`, both from one CA.
fn configs() -> (Arc<rustls::ServerConfig>, rustls::ClientConfig) {
    let (server, client, _) = pki();
    (server, client)
}

/// [`configs`], and the CA's roots.
fn pki() -> (Arc<rustls::ServerConfig>, rustls::ClientConfig, String) {
    let material = Material::self_signed("cluster.local", Duration::from_secs(3600)).unwrap();
    let ca = CertificateAuthority::new("cluster.local", CertTtl::default(), material);
    let (chain, key) = ca
        .issue_server_certificate(&["localhost".to_string()], Duration::from_secs(3600))
        .unwrap();
    let server = crate::tls::server_config(&chain, &key, &ca.roots_pem()).unwrap();
    let key = {
        use p256::elliptic_curve::Generate;
        p256::ecdsa::SigningKey::generate()
    };
    let identity = Identity::new("cluster.local", "shop", "default");
    let request = csr::build(&key, &identity.to_string()).unwrap();
    let chain = ca
        .sign_workload(&request, &identity, 3600)
        .unwrap()
        .concat();
    let key = key_to_pem(&key).unwrap();
    let client = crate::tls::client_config(&ca.roots_pem(), Some((&chain, &key))).unwrap();
    (server, client, ca.roots_pem())
}

/// Runs a test, failing it if it takes more than 20 s (a lost byte hangs a read).
async fn within<T>(test: impl Future<Output = T>) -> T {
    (tokio::time::timeout(Duration::from_secs(20), test).await).expect("the test hung")
}

fn server_name() -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from("localhost").unwrap()
}

/// Bytes no two offsets of which repeat within a record, so a lost or repeated piece shows.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// A listener, and a task that accepts one connection with `config` and returns it.
async fn serve_one(
    config: Arc<rustls::ServerConfig>,
) -> (
    std::net::SocketAddr,
    tokio::task::JoinHandle<io::Result<Secure<TcpStream>>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        accept(tcp, config).await
    });
    (address, accepted)
}

type ClientTls = tokio_rustls::client::TlsStream<TcpStream>;

/// A rustls client connected through `connector` to a server with `server`, and the
/// server's side of it.
async fn connected(
    server: Arc<rustls::ServerConfig>,
    connector: &tokio_rustls::TlsConnector,
) -> (ClientTls, Secure<TcpStream>) {
    let (address, accepted) = serve_one(server).await;
    let tcp = TcpStream::connect(address).await.unwrap();
    let tls = connector.connect(server_name(), tcp).await.unwrap();
    (tls, accepted.await.unwrap().unwrap())
}

fn connector(client: rustls::ClientConfig) -> tokio_rustls::TlsConnector {
    tokio_rustls::TlsConnector::from(Arc::new(client))
}

/// A rustls client driven by hand over its socket, its Finished sent, and the server's
/// side of the connection.
async fn connected_by_hand() -> (TcpStream, rustls::ClientConnection, Secure<TcpStream>) {
    let (server, client) = configs();
    let (address, accepted) = serve_one(server).await;
    let mut tcp = TcpStream::connect(address).await.unwrap();
    let mut conn = handshake_by_hand(client, &mut tcp).await;
    tcp.write_all(&tls_bytes(&mut conn)).await.unwrap();
    (tcp, conn, accepted.await.unwrap().unwrap())
}

/// Reads until the peer's close_notify; an error if the peer ends without one.
async fn read_to_close(io: &mut (impl AsyncRead + Unpin)) -> io::Result<Vec<u8>> {
    let mut all = Vec::new();
    io.read_to_end(&mut all).await?;
    Ok(all)
}

/// Echoes what `io` reads until the client's close_notify, writing each piece back as
/// three slices, then closes with close_notify.
async fn echo(mut io: Secure<TcpStream>) -> io::Result<usize> {
    let mut echoed = 0;
    let mut buf = vec![0; 40_000];
    loop {
        let n = io.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        let (a, rest) = buf[..n].split_at(n / 3);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut slices = [IoSlice::new(a), IoSlice::new(b), IoSlice::new(c)];
        let mut slices = &mut slices[..];
        while !slices.is_empty() {
            let written = io.write_vectored(slices).await?;
            IoSlice::advance_slices(&mut slices, written);
        }
        echoed += n;
    }
    io.shutdown().await?;
    Ok(echoed)
}

#[tokio::test]
async fn a_tls13_connection_runs_on_its_keys_alone_and_carries_data_both_ways() {
    within(async {
        let (server, client) = configs();
        let (mut tls, secure) = connected(server, &connector(client)).await;
        assert!(secure.is_records(), "TLS 1.3 runs on meshd's record layer");
        // The suite Envoy's BoringSSL negotiates with meshd, so the simulator's costs are
        // a real sidecar's.
        let suite = tls.get_ref().1.negotiated_cipher_suite().map(|s| s.suite());
        assert_eq!(suite, Some(rustls::CipherSuite::TLS13_AES_128_GCM_SHA256));
        let leaf = secure.peer().expect("the client's certificate");
        assert_eq!(
            leaf.0[..],
            [Identity::new("cluster.local", "shop", "default")],
            "the identity the client certificate names"
        );
        let echoed = tokio::spawn(echo(secure));

        // Many records each way, written in uneven pieces.
        let sent = payload(300_000);
        let writer = {
            let sent = sent.clone();
            let (mut read, mut write) = tokio::io::split(tls);
            let writer = tokio::spawn(async move {
                for piece in sent.chunks(7_919) {
                    write.write_all(piece).await.unwrap();
                }
                write.shutdown().await.unwrap();
                write
            });
            let back = read_to_close(&mut read)
                .await
                .expect("a clean close_notify");
            tls = read.unsplit(writer.await.unwrap());
            back
        };
        assert_eq!(writer.len(), sent.len());
        assert!(writer == sent, "what came back is what was sent");
        assert_eq!(echoed.await.unwrap().unwrap(), sent.len());
        drop(tls);
    })
    .await
}

/// Drives a rustls client by hand through its handshake over `tcp`, returning the
/// connection with its Finished still unsent.
async fn handshake_by_hand(
    client: rustls::ClientConfig,
    tcp: &mut TcpStream,
) -> rustls::ClientConnection {
    let mut conn = rustls::ClientConnection::new(Arc::new(client), server_name()).unwrap();
    let mut buf = vec![0; 32 * 1024];
    while conn.is_handshaking() {
        let mut out = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut out).unwrap();
        }
        tcp.write_all(&out).await.unwrap();
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server hung up in the handshake");
        conn.read_tls(&mut &buf[..n]).unwrap();
        conn.process_new_packets().unwrap();
    }
    conn
}

fn tls_bytes(conn: &mut rustls::ClientConnection) -> Vec<u8> {
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

#[tokio::test]
async fn what_a_client_sends_behind_its_finished_is_not_lost() {
    within(async {
        let (server, client) = configs();
        // The Finished leaves in one write with `first` (a whole record of data, which the
        // server's handshake reads and decrypts), or without it, and `split` bytes of the
        // next record (which the handshake begins to read).
        for (first, split) in [(true, 0), (true, 3), (false, 3), (false, 200)] {
            let (address, accepted) = serve_one(server.clone()).await;
            let mut tcp = TcpStream::connect(address).await.unwrap();
            let mut conn = handshake_by_hand(client.clone(), &mut tcp).await;
            let mut expected = Vec::new();
            if first {
                expected.extend_from_slice(b"first record");
                conn.writer().write_all(&expected).unwrap();
            }
            let mut out = tls_bytes(&mut conn);
            conn.writer().write_all(&payload(20_000)).unwrap();
            conn.send_close_notify();
            let rest = tls_bytes(&mut conn);
            out.extend_from_slice(&rest[..split]);
            tcp.write_all(&out).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            tcp.write_all(&rest[split..]).await.unwrap();

            let mut secure = accepted.await.unwrap().unwrap();
            assert!(secure.is_records());
            let got = read_to_close(&mut secure).await.unwrap();
            expected.extend_from_slice(&payload(20_000));
            assert!(
                got == expected,
                "first {first}, split {split}: {} bytes read",
                got.len()
            );
        }
    })
    .await
}

#[tokio::test]
async fn a_record_that_does_not_decrypt_ends_the_connection() {
    within(async {
        let (mut tcp, mut conn, mut secure) = connected_by_hand().await;

        conn.writer().write_all(b"hello").unwrap();
        let mut record = tls_bytes(&mut conn);
        let last = record.len() - 1;
        record[last] ^= 1;
        tcp.write_all(&record).await.unwrap();
        let e = secure.read(&mut [0; 100]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("bad_record_mac"), "{e}");
    })
    .await
}

#[tokio::test]
async fn a_records_claimed_length_past_the_limit_ends_the_connection() {
    within(async {
        let (mut tcp, _conn, mut secure) = connected_by_hand().await;

        tcp.write_all(&[23, 3, 3, 0x48, 0x01]).await.unwrap();
        let e = secure.read(&mut [0; 100]).await.unwrap_err();
        assert!(e.to_string().contains("a TLS record of 18433 bytes"), "{e}");
    })
    .await
}

#[tokio::test]
async fn a_clients_key_updates_are_followed_and_answered() {
    within(async {
        let (server, client) = configs();
        let (mut tls, mut secure) = connected(server, &connector(client)).await;
        assert!(secure.is_records());

        for round in 0..3 {
            // rustls's client asks for an update of the server's keys too.
            tls.get_mut().1.refresh_traffic_keys().unwrap();
            let words = format!("after update {round}");
            tls.write_all(words.as_bytes()).await.unwrap();
            let mut buf = vec![0; words.len()];
            secure.read_exact(&mut buf).await.unwrap();
            assert_eq!(buf, words.as_bytes(), "read with the client's next key");

            let reply = format!("reply {round}");
            secure.write_all(reply.as_bytes()).await.unwrap();
            let mut buf = vec![0; reply.len()];
            tls.read_exact(&mut buf).await.unwrap();
            assert_eq!(buf, reply.as_bytes(), "sealed with the server's next key");
        }
    })
    .await
}

#[tokio::test]
async fn a_tls12_client_keeps_rustls_connection() {
    within(async {
        let (server, _, roots_pem) = pki();
        let client = {
            let mut roots = rustls::RootCertStore::empty();
            for cert in crate::tls::certs(&roots_pem).unwrap() {
                roots.add(cert).unwrap();
            }
            let mut tls12 = rustls::ClientConfig::builder_with_provider(crate::tls::provider())
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            tls12.alpn_protocols = vec![b"h2".to_vec()];
            tls12
        };
        let (mut tls, secure) = connected(server, &connector(client)).await;
        assert!(!secure.is_records(), "TLS 1.2 stays on rustls");
        assert!(secure.peer().is_none(), "no client certificate was sent");
        let echoed = tokio::spawn(echo(secure));

        tls.write_all(&payload(50_000)).await.unwrap();
        tls.shutdown().await.unwrap();
        let back = read_to_close(&mut tls).await.unwrap();
        assert!(back == payload(50_000));
        assert_eq!(echoed.await.unwrap().unwrap(), 50_000);
    })
    .await
}

#[tokio::test]
async fn both_ends_on_records_carry_data() {
    within(async {
        let (server, mut client) = configs();
        client.enable_secret_extraction = true;
        let (address, accepted) = serve_one(server).await;
        let tcp = TcpStream::connect(address).await.unwrap();
        let mut records = connect(tcp, &connector(client), server_name())
            .await
            .unwrap();
        let echoed = tokio::spawn(echo(accepted.await.unwrap().unwrap()));

        let sent = payload(100_000);
        let (mut read, mut write) = tokio::io::split(&mut records);
        let (back, ()) = tokio::join!(read_to_close(&mut read), async {
            write.write_all(&sent).await.unwrap();
            write.shutdown().await.unwrap();
        });
        assert!(back.unwrap() == sent);
        assert_eq!(echoed.await.unwrap().unwrap(), sent.len());
    })
    .await
}

#[tokio::test]
async fn handshake_reads_stop_at_the_end_of_each_record() {
    within(async {
        let (mut near, far) = tokio::io::duplex(1 << 16);
        let mut stream = Vec::new();
        stream.extend_from_slice(&[22, 3, 3, 0, 4, 1, 2, 3, 4]);
        stream.extend_from_slice(&[23, 3, 3, 0, 0]);
        stream.extend_from_slice(&[23, 3, 3, 0, 3, 9]);
        near.write_all(&stream).await.unwrap();
        let mut bounded = Bounded::new(far);
        let mut reads = Vec::new();
        for _ in 0..5 {
            let mut buf = [0; 64];
            let n = bounded.read(&mut buf).await.unwrap();
            reads.push(buf[..n].to_vec());
        }
        assert_eq!(
            reads,
            [
                vec![22, 3, 3, 0, 4],
                vec![1, 2, 3, 4],
                vec![23, 3, 3, 0, 0],
                vec![23, 3, 3, 0, 3],
                vec![9],
            ]
        );
        assert_eq!(
            bounded.record,
            [23, 3, 3, 0, 3, 9],
            "the partial record is kept"
        );
    })
    .await
}

/// Keys both ends of a pair use for one direction, from a traffic secret made of `seed`
/// (kept, so that they can update, unless `seed` is 0).
fn keys(seed: u8) -> Keys {
    let secret = TrafficSecret::new(hkdf::HKDF_SHA384, &[seed.max(1); 48]).unwrap();
    let (key, iv) = secret.key_and_iv(&aead::AES_256_GCM);
    Keys::with(
        &aead::AES_256_GCM,
        &key,
        iv,
        0,
        (seed != 0).then_some(secret),
    )
    .unwrap()
}

fn records(
    io: tokio::io::DuplexStream,
    tx: u8,
    rx: u8,
    client: bool,
) -> Records<tokio::io::DuplexStream> {
    Records {
        io,
        tx: keys(tx),
        rx: keys(rx),
        client,
        received: Vec::new(),
        plain: Vec::new(),
        plain_at: 0,
        unsent: Vec::new(),
        unsent_at: 0,
        read_closed: false,
        close_notify_sent: false,
    }
}

/// A client's and a server's records over an in-memory pipe.
fn pair() -> (
    Records<tokio::io::DuplexStream>,
    Records<tokio::io::DuplexStream>,
) {
    let (a, b) = tokio::io::duplex(1 << 16);
    (records(a, 1, 2, true), records(b, 2, 1, false))
}

/// Seals one record of `content_type` holding `content` with `from`'s keys and sends it.
async fn send_record(
    from: &mut Records<tokio::io::DuplexStream>,
    content_type: u8,
    content: &[u8],
) {
    let mut out = Vec::new();
    from.tx
        .seal(content_type, &mut out, |out| out.extend_from_slice(content))
        .unwrap();
    from.io.write_all(&out).await.unwrap();
}

#[tokio::test]
async fn a_client_passes_over_session_tickets_and_a_server_refuses_them() {
    within(async {
        let (mut client, mut server) = pair();
        let ticket = [NEW_SESSION_TICKET, 0, 0, 3, 7, 7, 7];
        send_record(&mut server, HANDSHAKE, &ticket).await;
        server.write_all(b"after the ticket").await.unwrap();
        let mut buf = [0; 16];
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"after the ticket");

        send_record(&mut client, HANDSHAKE, &ticket).await;
        let e = server.read(&mut [0; 16]).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("unexpected TLS handshake message (4)"),
            "{e}"
        );
    })
    .await
}

#[tokio::test]
async fn a_handshake_message_split_over_records_ends_the_connection() {
    within(async {
        let (mut client, mut server) = pair();
        send_record(&mut server, HANDSHAKE, &[NEW_SESSION_TICKET, 0, 0, 9, 1]).await;
        let e = client.read(&mut [0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("split over records"), "{e}");
    })
    .await
}

#[tokio::test]
async fn padding_after_the_content_type_is_dropped() {
    within(async {
        let (mut client, mut server) = pair();
        // Content, its type, then zeros: what `seal` writes with type 0 after a content
        // that ends in the application-data type.
        send_record(&mut client, 0, b"padded\x17\0\0").await;
        let mut buf = [0; 6];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"padded");

        send_record(&mut client, 0, &[0, 0]).await;
        let e = server.read(&mut [0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("without a content type"), "{e}");
    })
    .await
}

#[tokio::test]
async fn close_notify_is_an_end_and_other_alerts_are_errors() {
    within(async {
        let (mut client, mut server) = pair();
        server.write_all(b"last words").await.unwrap();
        server.shutdown().await.unwrap();
        assert_eq!(read_to_close(&mut client).await.unwrap(), b"last words");

        let (mut client, mut server) = pair();
        send_record(&mut client, ALERT, &[2, 40]).await;
        let e = server.read(&mut [0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("TLS alert Some(40)"), "{e}");

        let (mut client, server) = pair();
        drop(server);
        let e = client.read(&mut [0; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    })
    .await
}

#[tokio::test]
async fn records_opened_past_a_full_read_buffer_wait_for_the_next_read() {
    within(async {
        let (mut client, mut server) = pair();
        // Three records in one write, read four bytes at a time.
        let mut out = Vec::new();
        for word in [&b"one "[..], b"two ", b"three"] {
            client
                .tx
                .seal(APPLICATION_DATA, &mut out, |out| {
                    out.extend_from_slice(word)
                })
                .unwrap();
        }
        client.io.write_all(&out).await.unwrap();
        let mut got = Vec::new();
        while got.len() < 13 {
            let mut buf = [0; 4];
            let n = server.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"one two three");
    })
    .await
}

#[tokio::test]
async fn records_the_socket_takes_in_part_arrive_whole_and_in_order() {
    within(async {
        // A pipe of 1,000 bytes: each 64 KiB of sealed records is taken in part or not at
        // all, kept, and sent on the next writes.
        let (a, b) = tokio::io::duplex(1000);
        let (mut client, mut server) = (records(a, 1, 2, true), records(b, 2, 1, false));
        let sent = payload(300_000);
        let (got, ()) = tokio::join!(
            async {
                let mut got = vec![0; sent.len()];
                server.read_exact(&mut got).await.unwrap();
                got
            },
            async {
                client.write_all(&sent).await.unwrap();
                client.flush().await.unwrap();
            }
        );
        assert!(got == sent);
        assert_eq!(client.unsent.capacity(), 0, "nothing is kept once written");
        // The kept buffer went back to the thread, which seals the next write into it.
        let capacity = SEALED.with_borrow(|sealed| sealed.capacity());
        assert!(capacity >= SEALED_CAPACITY, "{capacity}");
    })
    .await
}

#[tokio::test]
async fn past_the_record_limit_a_key_update_comes_first() {
    within(async {
        let (mut client, mut server) = pair();
        (client.tx.seq, server.rx.seq) = (RECORD_LIMIT, RECORD_LIMIT);
        let sent = payload(40_000);
        client.write_all(&sent).await.unwrap();
        assert!(client.tx.seq < 10, "the client's key was renewed");
        let mut got = vec![0; sent.len()];
        server.read_exact(&mut got).await.unwrap();
        assert!(got == sent);
        assert!(server.rx.seq < 10, "the server followed");
    })
    .await
}

#[tokio::test]
async fn a_key_update_without_a_kept_secret_or_with_a_bad_request_ends_the_connection() {
    within(async {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (records(a, 1, 2, true), records(b, 0, 0, false));
        client.tx = keys(0);
        send_record(&mut client, HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0]).await;
        let e = server.read(&mut [0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("traffic secret was not kept"), "{e}");

        let (mut client, mut server) = pair();
        send_record(&mut client, HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 2]).await;
        let e = server.read(&mut [0; 16]).await.unwrap_err();
        assert!(e.to_string().contains("KeyUpdate requesting 2"), "{e}");
    })
    .await
}

#[tokio::test]
async fn a_requested_key_update_is_answered_before_the_next_data() {
    within(async {
        let (mut client, mut server) = pair();
        send_record(
            &mut client,
            HANDSHAKE,
            &[KEY_UPDATE, 0, 0, 1, UPDATE_REQUESTED],
        )
        .await;
        client.tx = client.tx.next().unwrap();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0; 4];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        // The server's answer waits in front of its next data; the client reads it, moves
        // to the server's next key and reads the data with it.
        server.write_all(b"pong").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        let secret = |keys: &Keys| keys.secret.as_ref().unwrap().bytes;
        assert_eq!(client.rx.seq, 1, "one record under the server's next key");
        assert_ne!(secret(&client.rx), secret(&keys(2)), "the client moved on");
        assert_eq!(secret(&client.rx), secret(&server.tx));
    })
    .await
}

#[tokio::test]
async fn a_client_reconnecting_resumes_its_session_and_keeps_its_identity() {
    within(async {
        let (server, client) = configs();
        let connector = connector(client);
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let (mut tls, mut secure) = connected(server.clone(), &connector).await;
            assert!(secure.is_records());
            let identities = secure.peer().expect("the client's identity");
            assert_eq!(
                identities.0[..],
                [Identity::new("cluster.local", "shop", "default")]
            );
            // The client reads the session ticket in front of the server's data.
            secure.write_all(b"hello").await.unwrap();
            let mut buf = [0; 5];
            tls.read_exact(&mut buf).await.unwrap();
            kinds.push(tls.get_ref().1.handshake_kind());
        }
        assert_eq!(
            kinds,
            [
                Some(rustls::HandshakeKind::Full),
                Some(rustls::HandshakeKind::Resumed)
            ]
        );
    })
    .await
}
