//! Local ports for servers a test or the simulator starts.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

const FIRST: u32 = 20_000;
const COUNT: u32 = 12_000;

/// A port nobody listens on right now, each call in this process a different one. It
/// is taken from below the kernel's ephemeral range (32768-60999 by default). A port the
/// kernel hands out can be given to an outgoing connection before the server meant for
/// it binds it, or after a restarted server let it go: a client reconnecting to a port
/// in that range while nothing listens there may even be given that very port as its
/// own and connect to itself. Either makes the server's bind fail.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Another process starts elsewhere in the range.
    let start = std::process::id() % COUNT;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < COUNT, "no free port left in {FIRST}..{}", FIRST + COUNT);
        let port = (FIRST + (start + n) % COUNT) as u16;
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_below_the_ephemeral_range_distinct_and_bindable() {
        let (a, b) = (super::free_port(), super::free_port());
        assert_ne!(a, b);
        for port in [a, b] {
            assert!((20_000..32_000).contains(&port), "{port}");
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
