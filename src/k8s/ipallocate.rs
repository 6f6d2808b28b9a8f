//! IP auto-allocation for ServiceEntries, as istiod's `ipallocate` controller does it: a
//! ServiceEntry with no addresses of its own, a resolution other than `NONE` and no
//! `networking.istio.io/enable-autoallocate-ip: "false"` label gets, for each of its hosts
//! that is not a wildcard, one IPv4 address from `PILOT_IP_AUTOALLOCATE_IPV4_PREFIX`
//! (default `240.240.0.0/16`) and one IPv6 address from `PILOT_IP_AUTOALLOCATE_IPV6_PREFIX`
//! (default `2001:2::/48`), written into its `status.addresses` as `{value, host}`.
//!
//! Proxies whose agents capture DNS then know the host by that address: the agent's DNS
//! proxy answers with it, and the sidecar's TCP listener for the host is bound to it, so
//! two TCP ServiceEntries on one port no longer share `0.0.0.0_PORT`.
//!
//! Addresses in status are kept while they are the ServiceEntry's alone. Of two
//! ServiceEntries that hold one address, the older keeps it; an address that some
//! ServiceEntry names in its own `spec.addresses` is taken from any that was given it. A
//! ServiceEntry that no longer qualifies has its addresses cleared. Only the leader of a
//! revision writes, by server-side apply of `status.addresses` alone under its own field
//! manager, so the `Reconciled` condition [`super::status`] writes is left alone. Each
//! revision allocates for the ServiceEntries it serves, the only ones its proxies see; one
//! that moves to another revision keeps its addresses there unless they clash.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube::Client;
use serde_json::json;
use tokio::sync::watch;

use model::Store;
use model::config::{AllocatedAddress, Kind, ObjectKey, Spec};
use model::service::{allocatable_hosts, auto_allocates};
use xds::push::Push;

/// The field manager of the addresses' writes.
const FIELD_MANAGER: &str = "meshd-ip-autoallocate";

/// A prefix addresses are allocated from, and where the next search starts: an address is
/// not handed out again until the search has gone round the prefix, so one a deleted
/// ServiceEntry held is not reused while proxies may still hold it.
#[derive(Clone, Debug)]
struct Pool {
    /// The prefix's first address, as a number.
    base: u128,
    /// How many addresses the prefix holds.
    size: u128,
    ipv6: bool,
    /// The offset the next search starts at (never 0, the prefix's own address).
    next: u128,
}

/// Why an auto-allocation prefix cannot be used.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PrefixError {
    #[error("{0:?} is not a CIDR prefix (ADDRESS/BITS)")]
    NotCidr(String),
    #[error("{text:?}: {ip:?} is not an IP address")]
    NotAnAddress { text: String, ip: String },
    #[error("{text:?} is not {family} prefix")]
    WrongFamily { text: String, family: &'static str },
    #[error("{text:?}: the prefix length is not 0-{width}")]
    Length { text: String, width: u32 },
    #[error("{0:?} holds no address to allocate")]
    Empty(String),
}

impl Pool {
    /// `PREFIX/BITS`; the error says what is wrong.
    fn parse(text: &str, ipv6: bool) -> Result<Pool, PrefixError> {
        let (ip, bits) = text
            .split_once('/')
            .ok_or_else(|| PrefixError::NotCidr(text.to_string()))?;
        let ip: IpAddr = ip.parse().map_err(|_| PrefixError::NotAnAddress {
            text: text.to_string(),
            ip: ip.to_string(),
        })?;
        let value = match (ip, ipv6) {
            (IpAddr::V4(v4), false) => u128::from(u32::from(v4)),
            (IpAddr::V6(v6), true) => u128::from(v6),
            _ => {
                let family = if ipv6 { "an IPv6" } else { "an IPv4" };
                return Err(PrefixError::WrongFamily {
                    text: text.to_string(),
                    family,
                });
            }
        };
        let width = if ipv6 { 128 } else { 32 };
        let bits: u32 =
            (bits.parse().ok())
                .filter(|b| *b <= width)
                .ok_or_else(|| PrefixError::Length {
                    text: text.to_string(),
                    width,
                })?;
        let host_bits = width - bits;
        let size = 1u128.checked_shl(host_bits).unwrap_or(0);
        if size < 2 {
            return Err(PrefixError::Empty(text.to_string()));
        }
        let base = value & !(size - 1);
        Ok(Pool {
            base,
            size,
            ipv6,
            next: 1,
        })
    }

    fn address(&self, offset: u128) -> IpAddr {
        let n = self.base + offset;
        if self.ipv6 {
            IpAddr::V6(n.into())
        } else {
            IpAddr::V4((n as u32).into())
        }
    }

    /// The next address no one holds, searching on from the last one handed out; `None`
    /// when every address of the prefix is held.
    fn allocate(&mut self, held: &HashSet<IpAddr>) -> Option<IpAddr> {
        for i in 0..self.size - 1 {
            let offset = (self.next - 1 + i) % (self.size - 1) + 1;
            let ip = self.address(offset);
            if !held.contains(&ip) {
                self.next = offset % (self.size - 1) + 1;
                return Some(ip);
            }
        }
        None
    }
}

/// One ServiceEntry, as the allocator sees it.
#[derive(Clone, Debug)]
pub struct Entry {
    pub key: ObjectKey,
    /// Its creation timestamp: the older of two keeps an address both hold.
    pub creation: Option<String>,
    /// It should have auto-allocated addresses ([`auto_allocates`]).
    pub qualifies: bool,
    /// The hosts that get them ([`allocatable_hosts`]).
    pub hosts: Vec<String>,
    /// Its own `spec.addresses` that are IP addresses.
    pub own: Vec<IpAddr>,
    /// Its `status.addresses`.
    pub status: Vec<AllocatedAddress>,
}

impl Entry {
    /// The allocator's view of a stored ServiceEntry; `None` for any other object.
    pub fn of(obj: &model::config::ConfigObject) -> Option<Entry> {
        let Spec::ServiceEntry(se, status) = &obj.spec else {
            return None;
        };
        Some(Entry {
            key: obj.key.clone(),
            creation: obj.meta.creation_timestamp.clone(),
            qualifies: auto_allocates(se, &obj.meta.labels),
            hosts: (allocatable_hosts(se).into_iter())
                .map(str::to_string)
                .collect(),
            own: (se.addresses.iter())
                .filter_map(|a| a.parse().ok())
                .collect(),
            status: status.clone(),
        })
    }
}

/// The allocator's state: where each prefix's next search starts.
#[derive(Clone, Debug)]
pub struct Allocator {
    v4: Pool,
    v6: Pool,
}

impl Allocator {
    /// From the two prefixes (`PILOT_IP_AUTOALLOCATE_IPV4_PREFIX`, `..._IPV6_PREFIX`).
    pub fn new(ipv4: &str, ipv6: &str) -> Result<Allocator, PrefixError> {
        Ok(Allocator {
            v4: Pool::parse(ipv4, false)?,
            v6: Pool::parse(ipv6, true)?,
        })
    }

    /// From the environment, with istiod's defaults.
    pub fn from_env() -> anyhow::Result<Allocator> {
        let var = |name: &str, default: &str| {
            (std::env::var(name).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_string())
        };
        let v4 = var("PILOT_IP_AUTOALLOCATE_IPV4_PREFIX", "240.240.0.0/16");
        let v6 = var("PILOT_IP_AUTOALLOCATE_IPV6_PREFIX", "2001:2::/48");
        Allocator::new(&v4, &v6).map_err(|e| anyhow::anyhow!("IP auto-allocation prefix: {e}"))
    }

    /// The `status.addresses` each ServiceEntry should have, for those whose differ.
    pub fn plan(&mut self, entries: &[Entry]) -> Vec<(ObjectKey, Vec<AllocatedAddress>)> {
        let mut order: Vec<&Entry> = entries.iter().collect();
        order.sort_by(|a, b| (&a.creation, &a.key).cmp(&(&b.creation, &b.key)));
        // Addresses users gave their ServiceEntries are theirs; then each status address
        // is its oldest holder's.
        let mut held: HashSet<IpAddr> = entries.iter().flat_map(|e| e.own.clone()).collect();
        let mut kept: HashMap<&ObjectKey, BTreeMap<&str, Vec<IpAddr>>> = HashMap::new();
        for e in order.iter().filter(|e| e.qualifies) {
            let hosts = kept.entry(&e.key).or_default();
            for host in &e.hosts {
                let ips: Vec<IpAddr> = (e.status.iter())
                    .filter(|a| a.host == *host)
                    .map(|a| a.ip)
                    .collect();
                // A host keeps its addresses only if every one of them is still its own.
                if !ips.is_empty() && ips.iter().all(|ip| !held.contains(ip)) {
                    held.extend(ips.iter().copied());
                    hosts.insert(host, ips);
                }
            }
        }
        let mut out = Vec::new();
        for e in order {
            let mut desired = Vec::new();
            if e.qualifies {
                let hosts = kept.get(&e.key);
                for host in &e.hosts {
                    let ips = match hosts.and_then(|h| h.get(host.as_str())) {
                        Some(ips) => ips.clone(),
                        None => {
                            let fresh = [self.v4.allocate(&held), self.v6.allocate(&held)];
                            if fresh.iter().any(Option::is_none) {
                                tracing::error!(object = %e.key, host, "IP auto-allocation: a prefix is exhausted");
                            }
                            let fresh: Vec<IpAddr> = fresh.into_iter().flatten().collect();
                            held.extend(fresh.iter().copied());
                            fresh
                        }
                    };
                    desired.extend(ips.into_iter().map(|ip| AllocatedAddress {
                        host: host.clone(),
                        ip,
                    }));
                }
            }
            if desired != e.status {
                out.push((e.key.clone(), desired));
            }
        }
        out
    }
}

/// Runs the allocator on the leader after each push, writing what [`Allocator::plan`]
/// says.
pub struct IpAllocator {
    pub client: Client,
    pub store: Arc<RwLock<Store>>,
    pub pushes: watch::Receiver<Arc<Push>>,
    pub leader: watch::Receiver<bool>,
    pub allocator: Allocator,
}

impl IpAllocator {
    pub async fn run(mut self) {
        // Written and not yet seen back through the watch: what the entry's status is,
        // as far as the next plan is concerned.
        let mut pending: HashMap<ObjectKey, Vec<AllocatedAddress>> = HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                changed = self.pushes.changed() => if changed.is_err() { return },
                // A write that failed is tried again.
                _ = tick.tick() => {}
                changed = self.leader.changed() => if changed.is_err() { return },
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if !*self.leader.borrow_and_update() {
                pending.clear();
                continue;
            }
            let entries: Vec<Entry> = {
                let store = self.store.read().unwrap();
                let mut entries: Vec<Entry> = store
                    .of_kind(Kind::ServiceEntry)
                    .filter_map(|o| Entry::of(o))
                    .collect();
                pending.retain(|key, written| {
                    let Some(e) = entries.iter_mut().find(|e| e.key == *key) else {
                        return false;
                    };
                    if e.status == *written {
                        return false;
                    }
                    e.status = written.clone();
                    true
                });
                entries
            };
            for (key, addresses) in self.allocator.plan(&entries) {
                match self.write(&key, &addresses).await {
                    Ok(()) => {
                        tracing::info!(object = %key, ?addresses, "IP auto-allocation: status.addresses written");
                        pending.insert(key, addresses);
                    }
                    Err(e) => {
                        tracing::warn!(object = %key, "IP auto-allocation: writing status.addresses: {e}")
                    }
                }
            }
        }
    }

    async fn write(&self, key: &ObjectKey, addresses: &[AllocatedAddress]) -> kube::Result<()> {
        let addresses: Vec<_> = (addresses.iter())
            .map(|a| json!({"value": a.ip.to_string(), "host": a.host}))
            .collect();
        let status = json!({"addresses": addresses});
        super::status::apply_status(&self.client, key, FIELD_MANAGER, &status).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ObjectKey {
        ObjectKey {
            kind: Kind::ServiceEntry,
            namespace: "shop".into(),
            name: name.into(),
        }
    }

    fn entry(name: &str, created: &str, hosts: &[&str]) -> Entry {
        Entry {
            key: key(name),
            creation: Some(created.into()),
            qualifies: true,
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            own: Vec::new(),
            status: Vec::new(),
        }
    }

    fn addr(host: &str, ip: &str) -> AllocatedAddress {
        AllocatedAddress {
            host: host.into(),
            ip: ip.parse().unwrap(),
        }
    }

    fn plan(a: &mut Allocator, entries: &[Entry]) -> BTreeMap<String, Vec<String>> {
        (a.plan(entries).into_iter())
            .map(|(k, v)| {
                let v = v.iter().map(|a| format!("{}={}", a.host, a.ip)).collect();
                (k.name, v)
            })
            .collect()
    }

    fn istio_defaults() -> Allocator {
        Allocator::new("240.240.0.0/16", "2001:2::/48").unwrap()
    }

    #[test]
    fn each_host_gets_the_next_free_address_of_each_family_oldest_entry_first() {
        let mut a = istio_defaults();
        let entries = [
            entry("newer", "2026-11-02T00:00:00Z", &["db.example.com"]),
            entry(
                "older",
                "2026-11-01T00:00:00Z",
                &["a.example.com", "b.example.com"],
            ),
        ];
        let got = plan(&mut a, &entries);
        assert_eq!(
            got["older"],
            [
                "a.example.com=240.240.0.1",
                "a.example.com=2001:2::1",
                "b.example.com=240.240.0.2",
                "b.example.com=2001:2::2"
            ]
        );
        assert_eq!(
            got["newer"],
            ["db.example.com=240.240.0.3", "db.example.com=2001:2::3"]
        );
    }

    #[test]
    fn addresses_in_status_are_kept_and_not_given_to_another() {
        let mut a = istio_defaults();
        let mut kept = entry("kept", "2026-11-01T00:00:00Z", &["a.example.com"]);
        kept.status = vec![
            addr("a.example.com", "240.240.0.1"),
            addr("a.example.com", "2001:2::1"),
        ];
        let fresh = entry("fresh", "2026-11-02T00:00:00Z", &["b.example.com"]);
        let got = plan(&mut a, &[kept.clone(), fresh]);
        assert!(!got.contains_key("kept"), "{got:?}");
        assert_eq!(
            got["fresh"],
            ["b.example.com=240.240.0.2", "b.example.com=2001:2::2"]
        );
        // Written and read back: nothing more to do.
        let mut written = entry("fresh", "2026-11-02T00:00:00Z", &["b.example.com"]);
        written.status = vec![
            addr("b.example.com", "240.240.0.2"),
            addr("b.example.com", "2001:2::2"),
        ];
        assert!(a.plan(&[kept, written]).is_empty());
    }

    #[test]
    fn of_two_holders_the_older_keeps_the_address_and_users_addresses_win() {
        let mut a = istio_defaults();
        let mut older = entry("older", "2026-11-01T00:00:00Z", &["a.example.com"]);
        older.status = vec![addr("a.example.com", "240.240.0.5")];
        let mut newer = entry("newer", "2026-11-02T00:00:00Z", &["b.example.com"]);
        newer.status = vec![addr("b.example.com", "240.240.0.5")];
        let got = plan(&mut a, &[newer.clone(), older.clone()]);
        assert!(!got.contains_key("older"), "{got:?}");
        assert_eq!(
            got["newer"],
            ["b.example.com=240.240.0.1", "b.example.com=2001:2::1"]
        );
        // A user's own address in the prefix takes it from whoever was given it.
        let mut user = entry("user", "2026-11-03T00:00:00Z", &["c.example.com"]);
        user.qualifies = false;
        user.own = vec!["240.240.0.5".parse().unwrap()];
        let got = plan(&mut a, &[older, user]);
        assert_eq!(
            got["older"],
            ["a.example.com=240.240.0.2", "a.example.com=2001:2::2"]
        );
        assert!(!got.contains_key("user"), "{got:?}");
    }

    #[test]
    fn hosts_follow_the_spec_and_an_entry_that_no_longer_qualifies_is_cleared() {
        let mut a = istio_defaults();
        let mut e = entry("e", "2026-11-01T00:00:00Z", &["b.example.com"]);
        e.status = vec![
            addr("a.example.com", "240.240.0.1"),
            addr("b.example.com", "240.240.0.2"),
            addr("b.example.com", "2001:2::2"),
        ];
        let got = plan(&mut a, &[e.clone()]);
        assert_eq!(
            got["e"],
            ["b.example.com=240.240.0.2", "b.example.com=2001:2::2"]
        );
        e.qualifies = false;
        assert_eq!(plan(&mut a, &[e])["e"], Vec::<String>::new());
    }

    #[test]
    fn a_freed_address_is_reused_only_after_the_search_goes_round() {
        let mut a = Allocator::new("10.9.0.0/30", "fd00::/126").unwrap();
        let first = plan(&mut a, &[entry("one", "1", &["one.example.com"])]);
        assert_eq!(first["one"][0], "one.example.com=10.9.0.1");
        // "one" deleted: its address is not the next one handed out.
        let second = plan(&mut a, &[entry("two", "2", &["two.example.com"])]);
        assert_eq!(second["two"][0], "two.example.com=10.9.0.2");
        let third = plan(&mut a, &[entry("three", "3", &["three.example.com"])]);
        assert_eq!(third["three"][0], "three.example.com=10.9.0.3");
        let fourth = plan(&mut a, &[entry("four", "4", &["four.example.com"])]);
        assert_eq!(fourth["four"][0], "four.example.com=10.9.0.1");
    }

    #[test]
    fn an_exhausted_prefix_allocates_what_the_other_family_has() {
        let mut a = Allocator::new("10.9.0.0/31", "fd00::/64").unwrap();
        let got = plan(
            &mut a,
            &[
                entry("one", "1", &["one.example.com"]),
                entry("two", "2", &["two.example.com"]),
            ],
        );
        assert_eq!(
            got["one"],
            ["one.example.com=10.9.0.1", "one.example.com=fd00::1"]
        );
        assert_eq!(got["two"], ["two.example.com=fd00::2"]);
    }

    #[test]
    fn a_bad_prefix_is_refused_with_a_reason() {
        let err = |v4: &str, v6: &str| Allocator::new(v4, v6).unwrap_err().to_string();
        assert!(err("240.240.0.0", "2001:2::/48").contains("not a CIDR prefix"));
        assert!(err("240.240.0.0/33", "2001:2::/48").contains("prefix length"));
        assert!(err("2001:2::/48", "2001:2::/48").contains("not an IPv4 prefix"));
        assert!(err("240.240.0.0/16", "240.240.0.0/16").contains("not an IPv6 prefix"));
        assert!(err("240.240.0.1/32", "2001:2::/48").contains("no address"));
    }
}
