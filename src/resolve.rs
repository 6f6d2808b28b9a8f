//! Resolves the hostnames network gateways are known by (a cloud load balancer's name in
//! a gateway Service's status, a MeshNetworks gateway `address`), as istiod's
//! `NetworkGatewayNameCache` does: Envoy needs their IPs in load assignments. The answers
//! go into the store ([`Store::set_resolved`]), and a new answer is a change to the
//! object naming the hostname, so the next push carries it to every proxy.
//!
//! A hostname new to the configuration is resolved as soon as a push names it; all of
//! them again every [`REFRESH`]. A failed lookup keeps the last answer. IPv4 addresses
//! are kept when there are any (meshd's proxies are not told apart by IP family).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::filesource::OnChange;
use model::Store;
use xds::push::Push;

/// How often every gateway hostname is resolved again.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How long one lookup may take.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

pub async fn run(
    mut pushes: watch::Receiver<Arc<Push>>,
    store: Arc<RwLock<Store>>,
    on_change: OnChange,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut all = true;
    loop {
        let hostnames = pushes
            .borrow_and_update()
            .context
            .networks
            .hostnames
            .clone();
        let mut changed = BTreeSet::new();
        for (host, named_by) in hostnames {
            let known = store.read().unwrap().resolved(&host).is_some();
            if known && !all {
                continue;
            }
            let answer = match lookup(&host).await {
                Some(answer) => answer,
                // Keep what worked; record that an unknown host does not resolve.
                None if known => continue,
                None => Vec::new(),
            };
            if store.write().unwrap().set_resolved(&host, answer) {
                tracing::info!(host, "a network gateway's hostname resolved anew");
                changed.insert(named_by);
            }
        }
        if !changed.is_empty() {
            on_change(changed);
        }
        tokio::select! {
            r = pushes.changed() => {
                if r.is_err() {
                    return;
                }
                all = false;
            }
            _ = tokio::time::sleep(REFRESH) => all = true,
            _ = shutdown.changed() => return,
        }
    }
}

/// The addresses `host` resolves to (IPv4 when it has any), sorted; `None` when the
/// lookup fails.
async fn lookup(host: &str) -> Option<Vec<String>> {
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, 0))).await;
    let addresses: Vec<IpAddr> = match found {
        Ok(Ok(addresses)) => addresses.map(|a| a.ip()).collect(),
        Ok(Err(e)) => {
            tracing::warn!(host, error = %e, "a network gateway's hostname does not resolve");
            return None;
        }
        Err(_) => {
            tracing::warn!(host, "a network gateway's hostname lookup timed out");
            return None;
        }
    };
    Some(preferred(addresses))
}

/// IPv4 addresses if there are any, else the IPv6 ones; sorted, without duplicates.
fn preferred(addresses: Vec<IpAddr>) -> Vec<String> {
    let v4 = addresses.iter().any(IpAddr::is_ipv4);
    let set: BTreeSet<IpAddr> = (addresses.into_iter())
        .filter(|a| a.is_ipv4() == v4)
        .collect();
    set.into_iter().map(|a| a.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_answers_are_preferred_and_sorted() {
        let ips =
            |list: &[&str]| -> Vec<IpAddr> { list.iter().map(|a| a.parse().unwrap()).collect() };
        assert_eq!(
            preferred(ips(&["::1", "10.0.0.2", "10.0.0.1", "10.0.0.2"])),
            ["10.0.0.1", "10.0.0.2"]
        );
        assert_eq!(
            preferred(ips(&["fd00::2", "fd00::1"])),
            ["fd00::1", "fd00::2"]
        );
    }

    #[tokio::test]
    async fn localhost_resolves_and_an_invalid_name_does_not() {
        assert_eq!(lookup("localhost").await.unwrap(), ["127.0.0.1"]);
        assert!(lookup("no-such-host.invalid").await.is_none());
    }
}
