//! What an ADS connection knows of a push: [`Snapshot`], one trait. The connection, delta
//! and SotW code ask a snapshot for a proxy's view and for the difference between two
//! views, and never see the push context, the resource cache or how views are shared;
//! [`Push`](crate::push::Push) is the snapshot the push pipeline makes.

use std::sync::Arc;
use std::time::Instant;

use model::Proxy;

use crate::push::{ChangeSet, ViewDiff};
use crate::resource::{TypeKind, View};

/// One numbered, versioned state of the configuration, as the streams see it.
pub trait Snapshot: Send + Sync {
    /// Its number: snapshots are made in this order, and nonces and sync status carry it.
    fn number(&self) -> u64;
    /// The version every response built from it carries.
    fn version(&self) -> Arc<str>;
    /// When the first configuration event it carries happened (for convergence time).
    fn triggered_at(&self) -> Instant;
    /// The change sets from the snapshot after number `from` up to this one; `None` when
    /// any of them is unknown (a full push, one no longer remembered, or no `from`).
    fn changed_since(&self, from: Option<u64>) -> Option<Vec<ChangeSet>>;
    /// Everything `proxy` should hold now.
    fn view(&self, proxy: &Proxy) -> Arc<View>;
    /// What changed for `kind` from `from` (an earlier snapshot's view) to `to` (this
    /// one's); proxies that make the same step may share the answer.
    fn view_diff(&self, from: &Arc<View>, to: &Arc<View>, kind: TypeKind) -> Arc<ViewDiff>;
}
