//! RDS for gateways: a route configuration per listener port (`http.PORT`) or HTTPS server
//! (`https.PORT.NAME.GATEWAY.NS`), one virtual host per host that a server admits and a
//! bound VirtualService claims, holding the routes of each such VirtualService in turn;
//! hosts whose routes come from the same VirtualServices share one virtual host.
//! The plan ([`gateway_plan`]) is what both the full translation and the cache build from.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_api::pb::envoy::config::route::v3::{Route, VirtualHost};

use super::{depends_on_proxy, http_routes, kept_matches};
use crate::listener::{GatewayServer, server_host_pattern};
use api::networking::VirtualServiceSpec;
use model::config::ConfigObject;
use model::{Proxy, PushContext, host_matches};

/// A gateway route configuration before assembly: `http.PORT` for the HTTP servers of a
/// listener port, or `https.PORT.NAME.GATEWAY.NS` for one HTTPS server.
pub struct GatewayRoute {
    pub name: String,
    /// The port the gateway listens on (the blackhole virtual host's name).
    pub listen_port: u32,
    pub servers: Vec<GatewayServer>,
}

/// One virtual host of a gateway route configuration before assembly: `HOST:PORT`, for
/// `host` (and `more_hosts`), with the routes of each bound VirtualService in turn.
pub struct GatewayVirtualHost<'a> {
    pub host: String,
    /// Hosts whose routes come from the same VirtualServices, served by this virtual host
    /// too ([`collapse`]).
    pub more_hosts: Vec<String>,
    pub port: u32,
    pub sources: Vec<GatewayRoutes<'a>>,
    /// A server with `tls.httpsRedirect` admits the host: Envoy answers every plaintext
    /// request with a redirect to HTTPS (`require_tls: ALL`), as istiod sets it.
    pub require_tls: bool,
}

/// The HTTP routes one VirtualService gives a gateway server
/// ([`http_routes`](super::http_routes)): a function of the VirtualService, the server's
/// port and Gateway, and the services and DestinationRules of the hosts it routes to
/// ([`destination_hosts`](super::destination_hosts)) unless it matches on the source
/// ([`GatewayRoutes::shared`]), so callers may cache them.
#[derive(Clone, Copy)]
pub struct GatewayRoutes<'a> {
    pub vs: &'a Arc<ConfigObject>,
    pub spec: &'a VirtualServiceSpec,
    pub port: u32,
    /// `namespace/name` of the Gateway.
    pub gateway: &'a str,
}

impl GatewayRoutes<'_> {
    pub fn build(&self, ctx: &PushContext, proxy: &Proxy) -> Vec<Route> {
        http_routes(ctx, proxy, self.vs, self.spec, self.port, self.gateway)
    }

    /// Whether the routes are the same for every proxy.
    pub fn shared(&self) -> bool {
        !depends_on_proxy(self.spec)
    }
}

impl GatewayVirtualHost<'_> {
    /// The virtual host without its routes: they follow `domains` in prost's field order,
    /// so a caller may encode this and place encoded routes after the domains.
    pub fn head(&self) -> VirtualHost {
        VirtualHost {
            name: format!("{}:{}", self.host, self.port),
            domains: std::iter::once(&self.host)
                .chain(&self.more_hosts)
                .cloned()
                .collect(),
            ..Default::default()
        }
    }

    /// The virtual host, its routes built for `proxy`.
    pub fn build(&self, ctx: &PushContext, proxy: &Proxy) -> VirtualHost {
        self.with_tail(VirtualHost {
            routes: (self.sources.iter())
                .flat_map(|s| s.build(ctx, proxy))
                .collect(),
            ..self.head()
        })
    }

    /// What follows the routes ([`GatewayVirtualHost::head`]).
    pub fn tail(&self) -> VirtualHost {
        self.with_tail(VirtualHost::default())
    }

    /// `vhost` with the fields of [`GatewayVirtualHost::tail`] set: the one place they are
    /// written, for the full build and the cached pieces alike.
    fn with_tail(&self, vhost: VirtualHost) -> VirtualHost {
        use envoy_api::pb::envoy::config::route::v3::virtual_host::TlsRequirementType;
        let require_tls = if self.require_tls {
            TlsRequirementType::All
        } else {
            TlsRequirementType::None
        };
        VirtualHost {
            require_tls: require_tls as i32,
            include_request_attempt_count: true,
            ..vhost
        }
    }
}

/// The virtual host of a gateway route configuration no VirtualService claims a host of.
pub fn gateway_blackhole(listen_port: u32) -> VirtualHost {
    VirtualHost {
        name: format!("blackhole:{listen_port}"),
        domains: vec!["*".into()],
        ..Default::default()
    }
}

/// The virtual hosts of a gateway route configuration, by host: one per server host that
/// a VirtualService bound to the gateway claims, and one per host of a server with
/// `tls.httpsRedirect` (which redirects, routes or not); none when neither (then the
/// configuration holds [`gateway_blackhole`]).
pub fn gateway_plan<'a>(
    ctx: &'a PushContext,
    proxy: &Proxy,
    servers: &'a [GatewayServer],
) -> Vec<GatewayVirtualHost<'a>> {
    let labels = ctx.proxy_labels(proxy);
    let mut vhosts: BTreeMap<&str, GatewayVirtualHost> = BTreeMap::new();
    for server in servers {
        let (gateway, server_hosts, port) = (&server.gateway, &server.hosts, server.port);
        let gw_ns = gateway.split('/').next().unwrap_or_default();
        for (vs_obj, vs) in ctx.virtual_services_for(proxy, gateway) {
            let has_routes = (vs.http.iter())
                .any(|h| kept_matches(h, vs_obj, port, gateway, labels, proxy).is_some());
            if !has_routes {
                continue;
            }
            let source = GatewayRoutes {
                vs: vs_obj,
                spec: vs,
                port,
                gateway,
            };
            for vs_host in &vs.hosts {
                for server_host in server_hosts {
                    let Some(pattern) =
                        server_host_pattern(server_host, &vs_obj.key.namespace, gw_ns)
                    else {
                        continue;
                    };
                    // The narrower of the two names is the virtual host's domain.
                    let host = if host_matches(pattern, vs_host) {
                        if pattern.starts_with('*') && !vs_host.starts_with('*') || pattern == "*" {
                            vs_host
                        } else {
                            pattern
                        }
                    } else {
                        continue;
                    };
                    let vh = vhosts.entry(host).or_insert_with(|| GatewayVirtualHost {
                        host: host.to_string(),
                        more_hosts: Vec::new(),
                        port,
                        sources: Vec::new(),
                        require_tls: false,
                    });
                    vh.sources.push(source);
                    vh.require_tls |= server.https_redirect;
                }
            }
        }
        // istiod gives every host of a redirecting server a virtual host, so that a
        // plaintext request for it is redirected even where no VirtualService routes it.
        // Its domain is the host without the server's `namespace/` (istiod drops only
        // `*/`, and keeps `ns/` or `./` in the domain, where no request's Host matches).
        if server.https_redirect {
            for server_host in server_hosts {
                let host = server_host
                    .split_once('/')
                    .map_or(&**server_host, |(_, h)| h);
                let vh = vhosts.entry(host).or_insert_with(|| GatewayVirtualHost {
                    host: host.to_string(),
                    more_hosts: Vec::new(),
                    port,
                    sources: Vec::new(),
                    require_tls: true,
                });
                vh.require_tls = true;
            }
        }
    }
    collapse(vhosts.into_values().collect())
}

/// Merges virtual hosts whose routes come from the same VirtualServices in the same order
/// (and that redirect alike) into one, as istiod's `collapseDuplicateRoutes` does: a
/// VirtualService with several hosts gives a gateway one virtual host, not one copy of its
/// routes per host. The most specific host (istiod's `MoreSpecific`: names before
/// wildcards, longer first, then alphabetical) names it; the others follow as domains.
fn collapse(vhosts: Vec<GatewayVirtualHost<'_>>) -> Vec<GatewayVirtualHost<'_>> {
    let same = |a: &GatewayVirtualHost, b: &GatewayVirtualHost| {
        a.require_tls == b.require_tls
            && a.sources.len() == b.sources.len()
            && a.sources
                .iter()
                .zip(&b.sources)
                .all(|(x, y)| Arc::ptr_eq(x.vs, y.vs) && x.port == y.port && x.gateway == y.gateway)
    };
    let mut ordered = vhosts;
    ordered.sort_by(|a, b| more_specific(&a.host, &b.host));
    let mut kept: Vec<GatewayVirtualHost> = Vec::with_capacity(ordered.len());
    for vh in ordered {
        match kept.iter_mut().find(|k| same(k, &vh)) {
            Some(primary) => primary.more_hosts.push(vh.host),
            None => kept.push(vh),
        }
    }
    kept.sort_by(|a, b| a.host.cmp(&b.host));
    kept
}

/// istiod's host order: names before wildcards, longer before shorter, then alphabetical.
fn more_specific(a: &str, b: &str) -> std::cmp::Ordering {
    let wildcard = |h: &str| h.starts_with('*');
    (wildcard(a).cmp(&wildcard(b)))
        .then(b.len().cmp(&a.len()))
        .then(a.cmp(b))
}
