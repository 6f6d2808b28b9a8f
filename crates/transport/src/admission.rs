//! A bound on the connections a port has accepted but not yet answered.
//!
//! When a fleet reconnects at once (meshd restarted, say), accepting is far cheaper than
//! answering: each accepted connection's first requests sit in h2's read buffers until
//! they are served, about 100 KB each for an xDS stream that names the resources its proxy
//! already holds. So an accept loop [`Admission::reserve`]s a place before it accepts,
//! and [`Reserved::admit`]s the connection it accepts into it; the connection gives its
//! [`Ticket`] back when it sends the first bytes of a response (or closes). Beyond the
//! limit, connections wait in the kernel's listen backlog instead of meshd's heap.
//!
//! A client that connects and then sends nothing must not hold a place for long, or a few
//! such clients would stop the port: a ticket lapses [`HOLD`] after its connection was
//! accepted, answered or not. At worst, silent clients slow accepting down to `limit`
//! connections per [`HOLD`].
//!
//! Each port has its own [`Admission`]: an accept loop keeps one place reserved while it
//! waits, which must not starve another port's loop.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a ticket is held at most.
pub const HOLD: Duration = Duration::from_secs(3);

/// The places of one port.
#[derive(Debug)]
pub struct Admission {
    permits: Option<Arc<Semaphore>>,
    /// Connections admitted and holding their place now (shared by the ports).
    held: Gauge,
}

impl Admission {
    /// At most `limit` connections accepted and not yet answered (0 for no bound), those
    /// holding their place counted in `held`.
    pub fn new(limit: usize, held: Gauge) -> Admission {
        Admission {
            permits: (limit > 0).then(|| Arc::new(Semaphore::new(limit))),
            held,
        }
    }

    /// Waits for a free place, for the next connection to be accepted.
    pub async fn reserve(&self) -> Reserved {
        let permit = match &self.permits {
            Some(permits) => Some(
                (permits.clone().acquire_owned().await).expect("the semaphore is never closed"),
            ),
            None => None,
        };
        Reserved {
            permit,
            held: self.held.clone(),
        }
    }
}

/// A place taken for a connection not yet accepted.
#[derive(Debug)]
pub struct Reserved {
    permit: Option<OwnedSemaphorePermit>,
    held: Gauge,
}

impl Reserved {
    /// The accepted connection's ticket: it holds the place until it is released, dropped
    /// or [`HOLD`] has passed.
    pub fn admit(self) -> Ticket {
        let Reserved { permit, held } = self;
        let Some(permit) = permit else {
            return Ticket(Arc::default());
        };
        held.inc();
        let place = Arc::new(Mutex::new(Place {
            permit: Some(permit),
            held,
        }));
        let lapse = Arc::downgrade(&place);
        tokio::spawn(async move {
            tokio::time::sleep(HOLD).await;
            if let Some(place) = lapse.upgrade() {
                place.lock().unwrap().give_back();
            }
        });
        Ticket(place)
    }
}

/// A held place, and the gauge that counts it.
#[derive(Debug, Default)]
struct Place {
    permit: Option<OwnedSemaphorePermit>,
    held: Gauge,
}

impl Place {
    fn give_back(&mut self) {
        if self.permit.take().is_some() {
            self.held.dec();
        }
    }
}

/// One connection's place among those accepted and not yet answered.
#[derive(Debug)]
pub struct Ticket(Arc<Mutex<Place>>);

impl Ticket {
    /// Gives the place back: the connection has answered (or lapsed, or closed).
    pub fn release(&self) {
        self.0.lock().unwrap().give_back();
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release();
    }
}

/// A connection the accept loop admitted, with its ticket.
pub struct Admitted<T> {
    pub io: T,
    pub ticket: Ticket,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn places_are_given_back_on_release_on_drop_and_after_the_hold() {
        let held = Gauge::default();
        let admission = Arc::new(Admission::new(2, held.clone()));
        let answered = admission.reserve().await.admit();
        let closed = admission.reserve().await.admit();
        assert_eq!(held.get(), 2);
        let third = tokio::spawn({
            let admission = admission.clone();
            async move { admission.reserve().await }
        });
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "a third place while two are held");

        answered.release();
        answered.release();
        let reserved = third.await.unwrap();
        assert_eq!(held.get(), 1, "a ticket released twice is counted once");
        let silent = reserved.admit();
        drop(closed);
        assert_eq!(held.get(), 1);

        tokio::time::sleep(HOLD + Duration::from_millis(1)).await;
        assert_eq!(held.get(), 0, "a silent connection's place lapses");
        let both = async { (admission.reserve().await, admission.reserve().await) };
        let _both = (tokio::time::timeout(Duration::from_secs(1), both).await)
            .expect("the lapsed place is free again");
        drop(silent);
    }

    #[tokio::test]
    async fn no_limit_takes_no_place() {
        let held = Gauge::default();
        let admission = Admission::new(0, held.clone());
        let _tickets = [
            admission.reserve().await.admit(),
            admission.reserve().await.admit(),
        ];
        assert_eq!(held.get(), 0);
    }
}
