//! What a sidecar's inbound HTTP connection manager lets through to the application, as
//! istiod's does, tried through a real Envoy.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use crate::harness::*;
use crate::mtls::mesh;

/// An application that accepts a WebSocket upgrade (`101 Switching Protocols`) and then
/// echoes what it reads; any other request gets `426 Upgrade Required`. Its port.
fn websocket_echo() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut reader = BufReader::new(conn);
                let mut upgrade = false;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let line = line.to_ascii_lowercase();
                    upgrade |= line.starts_with("upgrade:") && line.contains("websocket");
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut conn = reader.into_inner();
                if !upgrade {
                    let _ = conn.write_all(
                        b"HTTP/1.1 426 Upgrade Required\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                    );
                    return;
                }
                let answer = "HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
                if conn.write_all(answer.as_bytes()).is_err() {
                    return;
                }
                let mut buf = [0u8; 1024];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

/// A WebSocket handshake to `addr`, then `ping` over the upgraded connection: the status
/// line, and what came back.
fn upgrade_and_ping(addr: &str, host: &str) -> std::io::Result<(String, String)> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        conn,
        "GET /chat HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )?;
    let mut reader = BufReader::new(conn);
    let mut status = String::new();
    reader.read_line(&mut status)?;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
    }
    if !status.contains(" 101 ") {
        return Ok((status.trim_end().to_string(), String::new()));
    }
    reader.get_mut().write_all(b"ping")?;
    let mut echo = [0u8; 4];
    reader.read_exact(&mut echo)?;
    Ok((
        status.trim_end().to_string(),
        String::from_utf8_lossy(&echo).into_owned(),
    ))
}

/// A WebSocket upgrade through a sidecar's inbound reaches the application, and the
/// upgraded connection carries bytes both ways, as istiod's inbound connection managers
/// allow (`upgrade_configs: websocket`). Without it Envoy answers the upgrade itself with
/// `403 Forbidden`.
#[test]
fn a_websocket_upgrade_reaches_the_application_through_the_inbound_sidecar() {
    let m = mesh("inbound-websocket");
    let app = websocket_echo();
    m.serve_from(app, |yaml| yaml);
    let _reviews = m.reviews(&[]);
    let addr = format!("{}:9080", m.server_ip);
    let host = "reviews.shop.svc.cluster.local";
    wait_until(
        "the sidecar to answer on its inbound port",
        Duration::from_secs(15),
        || http_get(&addr, host, "/", &[]).is_ok_and(|r| r.status == 426),
    );
    let (status, echo) = upgrade_and_ping(&addr, host).unwrap();
    assert!(status.contains(" 101 "), "{status}");
    assert_eq!(echo, "ping");
}
