//! Runs of encoded resources shared by the responses that carry them.
//!
//! The proxies of one namespace are sent the same resources: the whole initial
//! configuration when they connect (1.4 MB per unscoped sidecar on a 1,000-service mesh),
//! the same new route configuration when a VirtualService changes. Each resource's bytes
//! are shared already, but most resources are small, so every response copied them into
//! its own frame: a fifth to a quarter of meshd's CPU in a connect storm and in a
//! VirtualService push. A run of resources whose entries take at least [`JOIN_AT`] bytes
//! is now encoded once, and every frame that carries the same run (the same resources,
//! by identity, in the same order) holds that one copy.
//!
//! A run is kept while responses keep carrying it: [`Runs::sweep`] drops those no response
//! carried for [`KEEP`], so an idle meshd holds none, and the runs kept never take more
//! than [`CAPACITY`] bytes (a run that does not fit is sent once, as before). Frames being
//! written hold their own reference, so dropping a run never affects a send.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prost::bytes::{Bytes, BytesMut};

use super::metrics::Labels;
use super::resource::Resource;

/// Entries of a response taking at least this many bytes are sent as a shared run.
pub const JOIN_AT: usize = 16 * 1024;

/// How long a run is kept after a response last carried it.
pub const KEEP: Duration = Duration::from_secs(1);

/// The most bytes the kept runs take together.
pub const CAPACITY: usize = 128 << 20;

/// How a response carries each resource: a delta `Resource` (with or without its
/// version), or a state-of-the-world `Any` (field 2 in both messages).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Entry {
    Delta { versions: bool },
    Sotw,
}

struct Run {
    resources: Vec<Arc<Resource>>,
    bytes: Bytes,
    used: Instant,
}

/// The runs kept, by how they are encoded and a hash of their resources' addresses.
pub struct Runs {
    kept: Mutex<Kept>,
    capacity: usize,
    metrics: RunMetrics,
}

/// Where the runs are counted: the bytes kept (`meshd_xds_shared_run_bytes`), and the
/// responses whose run was encoded for them or reused from an earlier one
/// (`meshd_xds_shared_runs{use}`, both series there from the start).
#[derive(Clone, Debug)]
pub struct RunMetrics {
    pub bytes: Gauge,
    pub uses: Family<Labels, Counter>,
    encoded: Counter,
    reused: Counter,
}

impl Default for RunMetrics {
    fn default() -> Self {
        let uses: Family<Labels, Counter> = Family::default();
        let series = |name: &str| uses.get_or_create(&vec![("use", name.to_string())]).clone();
        RunMetrics {
            bytes: Gauge::default(),
            encoded: series("encoded"),
            reused: series("reused"),
            uses,
        }
    }
}

impl Default for Runs {
    fn default() -> Self {
        Runs::new(CAPACITY, RunMetrics::default())
    }
}

#[derive(Default)]
struct Kept {
    runs: HashMap<(Entry, u64), Run>,
    bytes: usize,
}

/// A hash of the resources' identities (their addresses: a resource is immutable, and a
/// kept run holds its resources, so an address is not reused while the run is kept).
fn identity(resources: &[Arc<Resource>]) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x6d65_7368).build_hasher();
    for r in resources {
        h.write_usize(Arc::as_ptr(r) as usize);
    }
    h.write_usize(resources.len());
    h.finish()
}

fn same(a: &[Arc<Resource>], b: &[Arc<Resource>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| Arc::ptr_eq(x, y))
}

impl Runs {
    /// Runs kept up to `capacity` bytes together, counted in `metrics`.
    pub fn new(capacity: usize, metrics: RunMetrics) -> Runs {
        Runs {
            kept: Mutex::default(),
            capacity,
            metrics,
        }
    }

    /// The entries of `resources` (`len` bytes, as `encode` writes them): the kept run if
    /// a response carried the same resources lately, else encoded now and kept.
    pub(super) fn get(
        &self,
        entry: Entry,
        resources: &[Arc<Resource>],
        len: usize,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Bytes {
        let key = (entry, identity(resources));
        let now = Instant::now();
        if let Some(run) = self.kept.lock().unwrap().runs.get_mut(&key)
            && same(&run.resources, resources)
        {
            run.used = now;
            self.metrics.reused.inc();
            return run.bytes.clone();
        }
        self.metrics.encoded.inc();
        let mut buf = BytesMut::with_capacity(len);
        encode(&mut buf);
        debug_assert_eq!(buf.len(), len, "a run's length is its entries' length");
        let bytes = buf.freeze();
        let mut kept = self.kept.lock().unwrap();
        if kept.bytes + bytes.len() <= self.capacity {
            let run = Run {
                resources: resources.to_vec(),
                bytes: bytes.clone(),
                used: now,
            };
            kept.bytes += bytes.len();
            if let Some(old) = kept.runs.insert(key, run) {
                kept.bytes -= old.bytes.len();
            }
            self.metrics.bytes.set(kept.bytes as i64);
        }
        bytes
    }

    /// Drops the runs no response carried since `now - KEEP`.
    pub fn sweep(&self, now: Instant) {
        let mut kept = self.kept.lock().unwrap();
        let Kept { runs, bytes } = &mut *kept;
        runs.retain(|_, run| {
            let keep = now.saturating_duration_since(run.used) < KEEP;
            if !keep {
                *bytes -= run.bytes.len();
            }
            keep
        });
        self.metrics.bytes.set(*bytes as i64);
    }

    /// The bytes of the runs kept now (`meshd_xds_shared_run_bytes`).
    pub fn bytes(&self) -> usize {
        self.kept.lock().unwrap().bytes
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.kept.lock().unwrap().runs.len()
    }
}

/// Drops `runs` no longer carried, twice per [`KEEP`], until the runtime ends.
pub fn spawn_sweeper(runs: Arc<Runs>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(KEEP / 2);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            runs.sweep(Instant::now());
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::test_cluster as cluster;

    const DELTA: Entry = Entry::Delta { versions: true };

    fn run(runs: &Runs, entry: Entry, resources: &[Arc<Resource>]) -> Bytes {
        let encoded: Vec<u8> = resources.iter().flat_map(|r| r.value().to_vec()).collect();
        runs.get(entry, resources, encoded.len(), |buf| {
            buf.extend_from_slice(&encoded)
        })
    }

    #[test]
    fn the_same_resources_share_one_run_until_none_carried_it_for_a_while() {
        let runs = Runs::default();
        let set: Vec<Arc<Resource>> = (0..3).map(|i| cluster(&format!("c{i}"))).collect();
        let first = run(&runs, DELTA, &set);
        let again = run(&runs, DELTA, &set.clone());
        assert_eq!(
            first.as_ptr(),
            again.as_ptr(),
            "the second response shares the run"
        );
        // Equal bytes are not enough: other resources of the same content are another run,
        // and so are the same resources encoded the other way.
        let copies: Vec<Arc<Resource>> = (0..3).map(|i| cluster(&format!("c{i}"))).collect();
        assert_ne!(run(&runs, DELTA, &copies).as_ptr(), first.as_ptr());
        assert_ne!(run(&runs, Entry::Sotw, &set).as_ptr(), first.as_ptr());
        let reordered = vec![set[1].clone(), set[0].clone(), set[2].clone()];
        assert_ne!(run(&runs, DELTA, &reordered).as_ptr(), first.as_ptr());
        assert_eq!(runs.len(), 4);
        let m = &runs.metrics;
        assert_eq!((m.encoded.get(), m.reused.get()), (4, 1));
        let held = runs.bytes();
        assert_eq!(held, 4 * first.len());
        assert_eq!(m.bytes.get(), held as i64);

        // Carried within KEEP: kept. Not carried for KEEP: dropped, with its bytes.
        runs.sweep(Instant::now());
        assert_eq!(runs.len(), 4);
        run(&runs, DELTA, &set);
        runs.sweep(Instant::now() + KEEP);
        assert_eq!((runs.len(), runs.bytes()), (0, 0));
        assert_eq!(m.bytes.get(), 0);
        // A frame still holding the run's bytes keeps them readable.
        assert_eq!(first.len(), held / 4);
        let fresh = run(&runs, DELTA, &set);
        assert_ne!(fresh.as_ptr(), first.as_ptr(), "encoded again once dropped");
    }

    #[test]
    fn runs_beyond_the_capacity_are_sent_but_not_kept() {
        let set: Vec<Arc<Resource>> = (0..3).map(|i| cluster(&format!("c{i}"))).collect();
        let len = run(&Runs::default(), DELTA, &set).len();
        let runs = Runs::new(len + len / 2, RunMetrics::default());
        run(&runs, DELTA, &set);
        let other: Vec<Arc<Resource>> = (0..3).map(|i| cluster(&format!("d{i}"))).collect();
        let sent = run(&runs, DELTA, &other);
        assert_eq!(sent.len(), len, "sent whole");
        assert_eq!((runs.len(), runs.bytes()), (1, len));
        assert_ne!(run(&runs, DELTA, &other).as_ptr(), sent.as_ptr());
    }
}
