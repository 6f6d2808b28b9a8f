//! Split-horizon EDS: a load assignment as a proxy on one network sees it, as istiod's
//! `EndpointsByNetworkFilter` builds it for sidecars and gateways
//! (`pilot/pkg/xds/endpoints/ep_filters.go`). Only when multi-network is on (some
//! network has a gateway, [`model::network`]):
//!
//! - an endpoint on the proxy's network, on no network, or on a network without a
//!   gateway is sent as it is; so is any endpoint to a proxy on no network, unless the
//!   endpoint's network has a gateway;
//! - an endpoint behind a gateway is replaced, within its locality, by its network's
//!   gateways, each weighted by the sum of the weights it stands for split evenly over
//!   them. Only mTLS endpoints (`tlsMode: istio`) are reachable that way: the gateway
//!   routes by the mTLS SNI, so the others are dropped;
//! - weights are first multiplied by the least common multiple of the networks'
//!   gateway counts, so that they divide evenly.
//!
//! Before that, whether or not multi-network is on, a proxy that names a network view
//! (`REQUESTED_NETWORK_VIEW`) keeps only the endpoints on those networks and on none, as
//! istiod's `ProxyView` does.

use std::collections::BTreeMap;

use envoy_api::pb::envoy::config::endpoint::v3::{
    Endpoint as PbEndpoint, LbEndpoint, lb_endpoint::HostIdentifier,
};
use envoy_api::pb::google::protobuf::UInt32Value;

use super::endpoint::{Group, is_mtls, istio_mtls_metadata, socket_address};
use super::locality::Place;
use model::PushContext;
use model::network::{NetworkGateway, NetworkGateways};

/// What a proxy at some place sees of the networks: its view, and the split when
/// multi-network is on.
#[derive(Clone, Copy)]
pub struct Split<'a> {
    /// The gateways and the proxy's network (empty when it names none).
    gateways: Option<(&'a NetworkGateways, &'a str)>,
    view: Option<&'a [String]>,
}

/// How `at`'s load assignments are filtered and split by network; `None` when neither
/// applies.
pub fn split<'a>(ctx: &'a PushContext, at: &'a Place) -> Option<Split<'a>> {
    let gateways = (at.network.as_deref())
        .filter(|_| ctx.networks.enabled())
        .map(|network| (&*ctx.networks, network));
    let view = at.network_view.as_deref();
    (gateways.is_some() || view.is_some()).then_some(Split { gateways, view })
}

impl<'a> Split<'a> {
    /// Drops the endpoints outside the proxy's view, then replaces, in each locality, the
    /// endpoints it reaches only through a gateway by the gateways; a locality left empty
    /// goes.
    pub fn apply<'g>(&self, groups: &mut Vec<Group<'g>>)
    where
        'a: 'g,
    {
        if let Some(view) = self.view {
            let visible = |network: &str| network.is_empty() || view.iter().any(|v| v == network);
            for group in groups.iter_mut() {
                group.endpoints.retain(|(e, _)| visible(&e.network));
            }
        }
        if let Some((gateways, network)) = self.gateways {
            split_by_network(groups, gateways, network);
        }
        groups.retain(|g| !g.endpoints.is_empty());
    }
}

/// The split proper, for a proxy on `network` (empty: none).
fn split_by_network<'a, 'g>(groups: &mut [Group<'g>], all: &'a NetworkGateways, network: &str)
where
    'a: 'g,
{
    let scale = all.scale();
    for group in groups.iter_mut() {
        let mut through: BTreeMap<&NetworkGateway, u32> = BTreeMap::new();
        for (e, mut lb) in std::mem::take(&mut group.endpoints) {
            let gateways = all.of(&e.network);
            let weight = match lb.load_balancing_weight.as_ref().map(|w| w.value) {
                None | Some(0) => scale,
                Some(w) => w.saturating_mul(scale),
            };
            let same = e.network.is_empty() || network.is_empty() || e.network == network;
            let forced = network.is_empty() && !e.network.is_empty() && !gateways.is_empty();
            if !forced && (same || gateways.is_empty()) {
                lb.load_balancing_weight = Some(UInt32Value { value: weight });
                group.endpoints.push((e, lb));
                continue;
            }
            if !is_mtls(&lb) {
                continue;
            }
            let each = weight / gateways.len() as u32;
            for g in gateways {
                let w = through.entry(g).or_default();
                *w = w.saturating_add(each);
            }
        }
        for (g, weight) in through {
            let Some(model) = all.model(&g.network) else {
                continue;
            };
            group
                .endpoints
                .push((model, gateway_endpoint(g, weight.max(1))));
        }
    }
}

/// A gateway in a load assignment: its address and port, mTLS (the client's SNI is
/// what it routes by), with the weight of the endpoints it stands for.
fn gateway_endpoint(g: &NetworkGateway, weight: u32) -> LbEndpoint {
    LbEndpoint {
        host_identifier: Some(HostIdentifier::Endpoint(PbEndpoint {
            address: Some(socket_address(&g.address, g.port)),
            ..Default::default()
        })),
        metadata: Some(istio_mtls_metadata()),
        load_balancing_weight: Some(UInt32Value { value: weight }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use model::Proxy;

    /// `api` has endpoints on net-a and net-b (two mTLS, one plaintext), and on net-c and
    /// no network; net-b has two gateways (so weights are doubled), net-c none.
    const MESH: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: api, namespace: shop}\nspec:\n  hosts: [api.example.com]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  endpoints:\n  - {address: 10.1.0.1, network: net-a, labels: {security.istio.io/tlsMode: istio}}\n  - {address: 10.2.0.1, network: net-b, weight: 3, labels: {security.istio.io/tlsMode: istio}}\n  - {address: 10.2.0.2, network: net-b, labels: {security.istio.io/tlsMode: istio}}\n  - {address: 10.2.0.3, network: net-b}\n  - {address: 10.3.0.1, network: net-c}\n  - {address: 10.4.0.1}\n";
    const GATEWAYS: &str = "---\napiVersion: v1\nkind: Service\nmetadata: {name: eastwest, namespace: istio-system, labels: {topology.istio.io/network: net-b}}\nspec:\n  externalIPs: [192.0.2.1, 192.0.2.2]\n  ports: [{name: tls, port: 15443}]\n";

    fn proxy(network: Option<&str>) -> Proxy {
        let mut meta = json!({"NAMESPACE": "shop"});
        if let Some(n) = network {
            meta["NETWORK"] = json!(n);
        }
        Proxy::from_node(
            "sidecar~10.9.0.1~p-0.shop~shop.svc.cluster.local",
            meta.as_object().unwrap(),
        )
        .unwrap()
    }

    /// `(address:port, weight)` of the load assignment's endpoints, for `proxy`.
    fn endpoints(ctx: &PushContext, proxy: &Proxy) -> Vec<(String, u32)> {
        let svc = &ctx.services["api.example.com"];
        let at = crate::locality::place(ctx, proxy);
        let cla =
            super::super::endpoint::load_assignment("c", svc, 80, |_| true, split(ctx, &at), None);
        let mut out: Vec<(String, u32)> = (cla.endpoints.iter().flat_map(|g| &g.lb_endpoints))
            .map(|e| {
                let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    panic!("an address")
                };
                let Some(envoy_api::pb::envoy::config::core::v3::address::Address::SocketAddress(a)) =
                    ep.address.as_ref().and_then(|a| a.address.as_ref())
                else {
                    panic!("a socket address")
                };
                let Some(envoy_api::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(port)) = a.port_specifier else {
                    panic!("a port")
                };
                (format!("{}:{port}", a.address), e.load_balancing_weight.as_ref().unwrap().value)
            })
            .collect();
        out.sort();
        out
    }

    fn pairs(list: &[(&str, u32)]) -> Vec<(String, u32)> {
        list.iter().map(|(a, w)| (a.to_string(), *w)).collect()
    }

    #[test]
    fn without_a_gateway_every_proxy_gets_every_endpoint() {
        let ctx = PushContext::from_yaml(MESH);
        assert!(!ctx.networks.enabled());
        let all = pairs(&[
            ("10.1.0.1:80", 1),
            ("10.2.0.1:80", 3),
            ("10.2.0.2:80", 1),
            ("10.2.0.3:80", 1),
            ("10.3.0.1:80", 1),
            ("10.4.0.1:80", 1),
        ]);
        assert_eq!(endpoints(&ctx, &proxy(Some("net-a"))), all);
        assert!(split(&ctx, &crate::locality::place(&ctx, &proxy(Some("net-a")))).is_none());
    }

    #[test]
    fn a_proxy_reaches_another_networks_mtls_endpoints_through_its_gateways() {
        let ctx = PushContext::from_yaml(&format!("{MESH}{GATEWAYS}"));
        assert_eq!(ctx.networks.scale(), 2);
        // From net-a: net-b's mTLS endpoints (weights 3 and 1, doubled) become its two
        // gateways at 4 each; its plaintext endpoint is dropped; net-c has no gateway and
        // the last endpoint no network, so both are sent as they are.
        let from_a = pairs(&[
            ("10.1.0.1:80", 2),
            ("10.3.0.1:80", 2),
            ("10.4.0.1:80", 2),
            ("192.0.2.1:15443", 4),
            ("192.0.2.2:15443", 4),
        ]);
        assert_eq!(endpoints(&ctx, &proxy(Some("net-a"))), from_a);
        // From net-b: its own endpoints directly, the others too (no gateway to them).
        let from_b = pairs(&[
            ("10.1.0.1:80", 2),
            ("10.2.0.1:80", 6),
            ("10.2.0.2:80", 2),
            ("10.2.0.3:80", 2),
            ("10.3.0.1:80", 2),
            ("10.4.0.1:80", 2),
        ]);
        assert_eq!(endpoints(&ctx, &proxy(Some("net-b"))), from_b);
        // A proxy on no network is sent to net-b's gateways all the same (istiod's
        // forced gateway), and reaches the rest directly.
        assert_eq!(endpoints(&ctx, &proxy(None)), from_a);
    }

    #[test]
    fn a_network_view_keeps_the_endpoints_on_its_networks_and_on_none() {
        let view = |network: Option<&str>, names: &str| {
            let mut p = proxy(network);
            let meta = json!({"NAMESPACE": "shop", "REQUESTED_NETWORK_VIEW": names});
            p.network_view = Proxy::from_node(&p.id, meta.as_object().unwrap())
                .unwrap()
                .network_view;
            p
        };
        // Without gateways: only the view filters.
        let ctx = PushContext::from_yaml(MESH);
        let seen = endpoints(&ctx, &view(Some("net-a"), " net-c ,net-a,"));
        assert_eq!(
            seen,
            pairs(&[("10.1.0.1:80", 1), ("10.3.0.1:80", 1), ("10.4.0.1:80", 1)])
        );
        // With them: net-b is out of view, so its gateways are not sent either.
        let ctx = PushContext::from_yaml(&format!("{MESH}{GATEWAYS}"));
        let seen = endpoints(&ctx, &view(Some("net-a"), "net-a"));
        assert_eq!(seen, pairs(&[("10.1.0.1:80", 2), ("10.4.0.1:80", 2)]));
        let seen = endpoints(&ctx, &view(Some("net-a"), "net-a,net-b"));
        assert_eq!(
            seen,
            pairs(&[
                ("10.1.0.1:80", 2),
                ("10.4.0.1:80", 2),
                ("192.0.2.1:15443", 4),
                ("192.0.2.2:15443", 4)
            ])
        );
    }

    #[test]
    fn gateway_endpoints_speak_mtls_and_keep_their_locality() {
        let yaml = format!("{MESH}{GATEWAYS}").replace(
            "network: net-b, weight: 3,",
            "network: net-b, weight: 3, locality: r/z,",
        );
        let ctx = PushContext::from_yaml(&yaml);
        let svc = &ctx.services["api.example.com"];
        let p = proxy(Some("net-a"));
        let at = crate::locality::place(&ctx, &p);
        let cla =
            super::super::endpoint::load_assignment("c", svc, 80, |_| true, split(&ctx, &at), None);
        let zoned = cla
            .endpoints
            .iter()
            .find(|g| g.locality.as_ref().is_some_and(|l| l.zone == "z"))
            .unwrap();
        assert_eq!(
            zoned.lb_endpoints.len(),
            2,
            "net-b's zoned endpoint is its two gateways"
        );
        assert!(zoned.lb_endpoints.iter().all(is_mtls));
        assert_eq!(zoned.load_balancing_weight.as_ref().unwrap().value, 6);
    }
}
