//! The floor under issue 5's missed targets: what the system calls and the cryptography an
//! xDS push needs cost on this machine, with no HTTP/2, gRPC, protobuf or control plane
//! at all. Two processes (this binary and a child of it, each on one thread, as meshd and
//! the fleet simulator share the machine's cores) do only what no implementation can
//! skip; whatever meshd and the simulator add comes on top. Figures live in BENCHMARKS.md;
//! nothing here asserts a time.
//!
//! `cargo bench --locked --bench floor -- push [PROXIES] [ROUNDS] [PUSH_BYTES] [ACK_BYTES]`
//!   Target 4's endpoint push: each round the control-plane process writes one
//!   `PUSH_BYTES` message (at most 4 KiB) to each of `PROXIES` loopback connections (one
//!   `write` each, as meshd does) stamped with the round's start; the fleet process reads
//!   each whole and answers with an `ACK_BYTES` message, as a delta ACK does. Prints each
//!   round's receipt percentiles, measured from the round's start, and each process's CPU
//!   per proxy.
//!
//! `cargo bench --locked --bench floor -- storm [CONNECTIONS] [BYTES] [plain|sealed]`
//!   Target 6's connect storm: one fresh loopback connection after another, each carrying
//!   `BYTES` (by default the 1.985 MB an unscoped secure proxy of the load mesh gets) to
//!   the fleet process, in TLS 1.3-sized records sealed with AES-128-GCM (ring, as
//!   meshd's record layer) and opened by the receiver when `sealed`. Prints connections
//!   per second and each process's CPU per connection, and the CPU of one mutual-TLS
//!   handshake's public-key operations measured in this process.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};

/// A TLS 1.3 record: 5 header bytes, at most 16 KiB of plaintext, its content-type byte
/// and a 16-byte tag.
const RECORD: usize = 16 * 1024;
const OVERHEAD: usize = 5 + 1 + 16;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let arg = |i: usize, default: usize| -> usize {
        args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
    };
    match (
        std::env::var("FLOOR_FLEET").ok(),
        args.first().map(String::as_str),
    ) {
        (Some(port), Some("push")) => push_fleet(
            port.parse().unwrap(),
            arg(1, 10_000),
            arg(2, 10),
            arg(3, 420),
            arg(4, 90),
        ),
        (Some(port), Some("storm")) => storm_fleet(
            port.parse().unwrap(),
            arg(1, 2_000),
            args.get(3).is_some_and(|m| m == "sealed"),
        ),
        (None, Some("push")) => push(arg(1, 10_000), arg(2, 10), arg(3, 420), arg(4, 90)),
        (None, Some("storm")) => storm(
            arg(1, 2_000),
            arg(2, 1_985_236),
            args.get(3).is_some_and(|m| m == "sealed"),
        ),
        _ => eprintln!(
            "usage: floor push [PROXIES] [ROUNDS] [PUSH_BYTES] [ACK_BYTES] | storm [CONNECTIONS] [BYTES] [plain|sealed]"
        ),
    }
}

/// This process's CPU time so far, user and kernel.
fn cpu() -> Duration {
    // SAFETY: getrusage writes one rusage into the zeroed value it is given.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1_000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Monotonic time in nanoseconds, the same clock in both processes.
fn now_ns() -> u64 {
    // SAFETY: clock_gettime writes one timespec into the value it is given.
    let ts = unsafe {
        let mut ts: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
        ts
    };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Starts this binary again as the fleet process, told the listener's port.
fn fleet(listener: &TcpListener, args: &[String]) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(args)
        .env(
            "FLOOR_FLEET",
            listener.local_addr().unwrap().port().to_string(),
        )
        .stdin(Stdio::null())
        .spawn()
        .expect("starting the fleet process")
}

/// Level-triggered readiness for many non-blocking sockets, one thread.
struct Epoll(i32);

impl Epoll {
    fn new(sockets: &[TcpStream]) -> Epoll {
        // SAFETY: plain epoll calls on descriptors this process owns; each event's data is
        // the socket's index in `sockets`.
        unsafe {
            let fd = libc::epoll_create1(0);
            assert!(fd >= 0, "epoll_create1");
            for (i, s) in sockets.iter().enumerate() {
                let mut event = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: i as u64,
                };
                libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut event);
            }
            Epoll(fd)
        }
    }

    /// The indexes of sockets ready to read, into `ready`.
    fn wait(&self, events: &mut [libc::epoll_event], ready: &mut Vec<usize>) {
        ready.clear();
        // SAFETY: `events` is a valid buffer of its length.
        let n = unsafe { libc::epoll_wait(self.0, events.as_mut_ptr(), events.len() as i32, -1) };
        ready.extend(events[..n.max(0) as usize].iter().map(|e| e.u64 as usize));
    }
}

fn events() -> Vec<libc::epoll_event> {
    vec![libc::epoll_event { events: 0, u64: 0 }; 1024]
}

fn prepared(s: TcpStream) -> TcpStream {
    s.set_nodelay(true).unwrap();
    s.set_nonblocking(true).unwrap();
    s
}

/// The largest push measured: one that leaves in one `write` to an idle socket. Larger
/// ones (a route configuration) would need writes driven by writability, which this floor
/// does not have; it would be no floor for them.
const MAX_PUSH: usize = 4096;

fn push(proxies: usize, rounds: usize, push_bytes: usize, ack_bytes: usize) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let push_bytes = push_bytes.max(8);
    assert!(push_bytes <= MAX_PUSH, "pushes of at most {MAX_PUSH} B");
    let args = ["push", &proxies.to_string(), &rounds.to_string()];
    let sizes = [push_bytes.to_string(), ack_bytes.to_string()];
    let mut child = fleet(&listener, &[&args.map(String::from)[..], &sizes].concat());
    let mut sockets: Vec<TcpStream> = (0..proxies)
        .map(|_| prepared(listener.accept().unwrap().0))
        .collect();
    let epoll = Epoll::new(&sockets);
    let (mut events, mut ready) = (events(), Vec::new());
    let mut message = vec![b'p'; push_bytes];
    let mut buf = vec![0u8; 64 * 1024];
    let mut spent = Duration::ZERO;
    for round in 0..rounds {
        std::thread::sleep(Duration::from_millis(300));
        let start_cpu = cpu();
        let start = now_ns();
        message[..8].copy_from_slice(&start.to_le_bytes());
        for s in &mut sockets {
            s.write_all(&message).unwrap();
        }
        // Each ACK is smaller than a segment, so it arrives in one read.
        let mut acked = 0;
        while acked < proxies {
            epoll.wait(&mut events, &mut ready);
            for &i in &ready {
                if matches!(sockets[i].read(&mut buf), Ok(n) if n > 0) {
                    acked += 1;
                }
            }
        }
        let round_cpu = cpu() - start_cpu;
        spent += round_cpu;
        println!(
            "control plane, round {round}: every ACK read {:.1} ms after the start; {:.1} µs CPU per proxy",
            (now_ns() - start) as f64 / 1e6,
            round_cpu.as_secs_f64() * 1e6 / proxies as f64,
        );
    }
    child.wait().unwrap();
    println!(
        "control plane: {:.1} µs CPU per proxy per push",
        spent.as_secs_f64() * 1e6 / (proxies * rounds) as f64
    );
}

fn push_fleet(port: u16, proxies: usize, rounds: usize, push_bytes: usize, ack_bytes: usize) {
    let mut sockets: Vec<TcpStream> = (0..proxies)
        .map(|_| prepared(TcpStream::connect(("127.0.0.1", port)).unwrap()))
        .collect();
    let epoll = Epoll::new(&sockets);
    let (mut events, mut ready) = (events(), Vec::new());
    let ack = vec![b'a'; ack_bytes];
    let mut buf = vec![0u8; 64 * 1024];
    // Per proxy: bytes of this round's message read so far, and its start stamp.
    let mut partial = vec![(0usize, 0u64); proxies];
    let mut latencies = Vec::with_capacity(proxies);
    let start_cpu = cpu();
    for round in 0..rounds {
        latencies.clear();
        while latencies.len() < proxies {
            epoll.wait(&mut events, &mut ready);
            for &i in &ready {
                let n = match sockets[i].read(&mut buf) {
                    Ok(n) if n > 0 => n,
                    _ => continue,
                };
                // A message arrives in one read or, near a segment's end, a few.
                let (got, sent) = &mut partial[i];
                if *got == 0 {
                    // The stamp is the message's first 8 bytes; a read takes at least them.
                    *sent = u64::from_le_bytes(buf[..8].try_into().unwrap());
                }
                *got += n;
                if *got < push_bytes {
                    continue;
                }
                latencies.push(now_ns().saturating_sub(*sent));
                *got = 0;
                sockets[i].write_all(&ack).unwrap();
            }
        }
        latencies.sort_unstable();
        let at = |q: f64| latencies[((proxies as f64 * q) as usize).min(proxies - 1)] as f64 / 1e6;
        println!(
            "fleet, round {round}: held by p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms after the start",
            at(0.5),
            at(0.99),
            at(1.0),
        );
    }
    println!(
        "fleet: {:.1} µs CPU per proxy per push",
        (cpu() - start_cpu).as_secs_f64() * 1e6 / (proxies * rounds) as f64
    );
}

fn key() -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[7; 16]).unwrap())
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [9u8; 12];
    for (b, s) in n[4..].iter_mut().zip(seq.to_be_bytes()) {
        *b ^= s;
    }
    Nonce::assume_unique_for_key(n)
}

fn storm(connections: usize, bytes: usize, sealed: bool) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let mode = if sealed { "sealed" } else { "plain" };
    let args = ["storm", &connections.to_string(), &bytes.to_string(), mode];
    let mut child = fleet(&listener, &args.map(String::from));
    let key = key();
    let config = vec![b'c'; bytes];
    // Up to 64 KiB of records per write, as meshd's record layer seals them.
    let mut out = Vec::with_capacity(4 * (RECORD + OVERHEAD));
    let start_cpu = cpu();
    let start = Instant::now();
    for _ in 0..connections {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut seq = 0;
        for batch in config.chunks(4 * RECORD) {
            if !sealed {
                s.write_all(batch).unwrap();
                continue;
            }
            out.clear();
            for chunk in batch.chunks(RECORD) {
                let len = chunk.len() + 1 + 16;
                out.extend_from_slice(&[23, 3, 3, (len >> 8) as u8, len as u8]);
                let at = out.len();
                out.extend_from_slice(chunk);
                out.push(23);
                let tag = key
                    .seal_in_place_separate_tag(nonce(seq), Aad::empty(), &mut out[at..])
                    .unwrap();
                out.extend_from_slice(tag.as_ref());
                seq += 1;
            }
            s.write_all(&out).unwrap();
        }
    }
    child.wait().unwrap();
    let elapsed = start.elapsed();
    println!(
        "control plane: {connections} connections of {bytes} B ({mode}) in {:.2} s, {:.0}/s; {:.0} µs CPU per connection",
        elapsed.as_secs_f64(),
        connections as f64 / elapsed.as_secs_f64(),
        (cpu() - start_cpu).as_secs_f64() * 1e6 / connections as f64,
    );
    if sealed {
        handshake_cpu();
    }
}

fn storm_fleet(port: u16, connections: usize, sealed: bool) {
    let key = key();
    let mut buf = vec![0u8; 256 * 1024];
    let start_cpu = cpu();
    let mut received = 0usize;
    for _ in 0..connections {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        let (mut filled, mut seq) = (0usize, 0u64);
        loop {
            let n = s.read(&mut buf[filled..]).unwrap();
            if n == 0 {
                break;
            }
            filled += n;
            if !sealed {
                received += filled;
                filled = 0;
                continue;
            }
            // Open every whole record read so far; keep a partial one's bytes.
            let mut at = 0;
            while filled - at >= 5 {
                let len = u16::from_be_bytes([buf[at + 3], buf[at + 4]]) as usize;
                if filled - at < 5 + len {
                    break;
                }
                let record = &mut buf[at + 5..at + 5 + len];
                let (body, tag) = record.split_at_mut(len - 16);
                let tag = Tag::try_from(&*tag).unwrap();
                key.open_in_place_separate_tag(nonce(seq), Aad::empty(), tag, body, 0..)
                    .expect("a record that does not open");
                received += len - 1 - 16;
                seq += 1;
                at += 5 + len;
            }
            buf.copy_within(at..filled, 0);
            filled -= at;
        }
    }
    println!(
        "fleet: {received} B received; {:.0} µs CPU per connection",
        (cpu() - start_cpu).as_secs_f64() * 1e6 / connections as f64
    );
}

/// The public-key operations of one mutual-TLS 1.3 handshake with P-256 certificates
/// signed by a P-256 CA, both sides together: two X25519 key pairs and agreements, two
/// CertificateVerify signatures, and four signature checks (each side checks the other's
/// certificate and CertificateVerify).
fn handshake_cpu() {
    use ring::agreement::{EphemeralPrivateKey, UnparsedPublicKey, X25519, agree_ephemeral};
    use ring::signature::{self, ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair};
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let public =
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, pair.public_key());
    let transcript = [5u8; 130];
    let rounds = 200;
    let start = cpu();
    for _ in 0..rounds {
        // Each side's key share and its agreement with the other's.
        for _ in 0..2 {
            let mine = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
            let theirs = EphemeralPrivateKey::generate(&X25519, &rng).unwrap();
            let peer = UnparsedPublicKey::new(&X25519, theirs.compute_public_key().unwrap());
            agree_ephemeral(mine, &peer, |k| k[0]).unwrap();
        }
        for _ in 0..2 {
            let sig = pair.sign(&rng, &transcript).unwrap();
            public.verify(&transcript, sig.as_ref()).unwrap();
            public.verify(&transcript, sig.as_ref()).unwrap();
        }
    }
    println!(
        "one mutual-TLS handshake's public-key operations, both sides: {:.0} µs CPU",
        (cpu() - start).as_secs_f64() * 1e6 / rounds as f64
    );
}
