//! The names one control-plane revision answers to: its own, and every revision tag that
//! points to it. istioctl makes a tag `T` for revision `R` as the MutatingWebhookConfiguration
//! `istio-revision-tag-T`, labelled `istio.io/tag=T` and `istio.io/rev=R`; a namespace
//! labelled `istio.io/rev=T` is then `R`'s, and moving the tag moves it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

/// A revision and the tags pointing to it now; clones share the tags.
#[derive(Clone, Debug)]
pub struct Revisions {
    revision: Arc<str>,
    tags: Arc<RwLock<BTreeSet<String>>>,
}

impl Revisions {
    /// `revision`, with no tags yet.
    pub fn new(revision: &str) -> Revisions {
        Revisions {
            revision: revision.into(),
            tags: Arc::default(),
        }
    }

    /// The revision itself (`--revision`).
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// Whether `name` (an `istio.io/rev` value) is this revision or one of its tags.
    pub fn answers_to(&self, name: &str) -> bool {
        name == &*self.revision || self.tags.read().unwrap().contains(name)
    }

    /// The tags pointing to this revision.
    pub fn tags(&self) -> BTreeSet<String> {
        self.tags.read().unwrap().clone()
    }

    /// Sets the tags from every tag and the revision it points to; true when this
    /// revision's tags changed.
    pub fn set_tags(&self, all: &BTreeMap<String, String>) -> bool {
        let mine: BTreeSet<String> = (all.iter())
            .filter(|(_, revision)| **revision == *self.revision)
            .map(|(tag, _)| tag.clone())
            .collect();
        let mut tags = self.tags.write().unwrap();
        let changed = *tags != mine;
        *tags = mine;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_answers_to_its_name_and_to_the_tags_pointing_at_it() {
        let blue = Revisions::new("blue");
        let shared = blue.clone();
        assert!(blue.answers_to("blue") && !blue.answers_to("prod"));
        let tags = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            (pairs.iter())
                .map(|(t, r)| (t.to_string(), r.to_string()))
                .collect()
        };
        assert!(blue.set_tags(&tags(&[("prod", "blue"), ("canary", "green")])));
        assert!(shared.answers_to("prod"), "clones share the tags");
        assert!(!shared.answers_to("canary") && !shared.answers_to("green"));
        assert!(!blue.set_tags(&tags(&[("prod", "blue")])), "unchanged");
        // The tag moves: blue no longer answers to it.
        assert!(blue.set_tags(&tags(&[("prod", "green")])));
        assert!(!shared.answers_to("prod"));
        assert_eq!(blue.revision(), "blue");
    }
}
