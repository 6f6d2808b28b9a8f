//! The label sets of connected proxies, each kept once. The sidecars of one workload carry
//! the same labels, and a label map costs a proxy ~0.5 KB however few labels it holds (a
//! B-tree node has room for eleven).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

pub type Labels = BTreeMap<String, String>;

#[derive(Default)]
pub struct LabelSets(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    sets: HashSet<Arc<Labels>>,
    /// How many sets the last sweep left.
    swept: usize,
}

/// Sets kept before the first sweep for sets no proxy holds any more.
const FIRST_SWEEP: usize = 64;

impl LabelSets {
    /// The shared set equal to `labels`, which becomes it when there is none yet.
    pub fn intern(&self, labels: Arc<Labels>) -> Arc<Labels> {
        if labels.is_empty() {
            return labels; // an empty map allocates nothing to share
        }
        let mut inner = self.0.lock().unwrap();
        if let Some(found) = inner.sets.get(&*labels) {
            return found.clone();
        }
        // Two proxies of one set that leave at once may each see the other still
        // holding it, and leave it behind: such sets are swept as the table doubles.
        if inner.sets.len() >= (inner.swept * 2).max(FIRST_SWEEP) {
            inner.sets.retain(|s| Arc::strong_count(s) > 1);
            inner.swept = inner.sets.len();
        }
        inner.sets.insert(labels.clone());
        labels
    }

    /// A proxy holding `labels` is leaving: the set goes with its last proxy.
    pub fn release(&self, labels: &Arc<Labels>) {
        let mut inner = self.0.lock().unwrap();
        // The table's reference and the leaving proxy's are the last two.
        if Arc::strong_count(labels) <= 2
            && inner
                .sets
                .get(&**labels)
                .is_some_and(|s| Arc::ptr_eq(s, labels))
        {
            inner.sets.remove(&**labels);
        }
    }

    /// Sets held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().sets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(app: &str) -> Arc<Labels> {
        Arc::new(BTreeMap::from([("app".to_string(), app.to_string())]))
    }

    #[test]
    fn equal_label_sets_are_shared_and_go_with_their_last_proxy() {
        let sets = LabelSets::default();
        let a = sets.intern(labels("reviews"));
        let b = sets.intern(labels("reviews"));
        let c = sets.intern(labels("ratings"));
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(sets.len(), 2);
        sets.release(&a);
        drop(a);
        assert_eq!(sets.len(), 2, "b still holds reviews");
        sets.release(&b);
        drop(b);
        assert_eq!(sets.len(), 1);
        // Nothing is kept for proxies without labels.
        sets.intern(Arc::new(Labels::new()));
        assert_eq!(sets.len(), 1);
    }

    #[test]
    fn sets_left_behind_by_proxies_leaving_together_are_swept() {
        let sets = LabelSets::default();
        for i in 0..FIRST_SWEEP {
            // Interned and dropped without a release: left behind.
            drop(sets.intern(labels(&format!("app-{i}"))));
        }
        let kept = sets.intern(labels("kept"));
        assert_eq!(sets.len(), 1, "the sweep left only the set still held");
        assert!(Arc::ptr_eq(&kept, &sets.intern(labels("kept"))));
    }
}
