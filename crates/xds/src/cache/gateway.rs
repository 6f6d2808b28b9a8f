//! The gateway part of the cache: the routes each VirtualService gives a gateway server,
//! encoded once and valid while what they were built from is unchanged, and the gateway
//! virtual hosts assembled from them, kept for the views of a push and of the next.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use prost::Message;

use super::{Destination, Generations, ResourceCache, VIRTUAL_HOSTS, encode_routes, same};
use model::config::{ConfigObject, Kind, ObjectKey, Spec};
use model::{Proxy, PushContext};
use translate::{self, route::GatewayRoutes, route::GatewayVirtualHost};

/// The routes one VirtualService gives a gateway server ([`GatewayRoutes`]), encoded as
/// a run of `VirtualHost.routes` fields, and what they were built from.
pub(super) struct GatewayRoutesEntry {
    port: u32,
    gateway: Box<str>,
    /// The context it was built for, as [`RoutedHost::ctx`](super::RoutedHost::ctx).
    ctx: u64,
    vs: Arc<ConfigObject>,
    destinations: Vec<Destination>,
    bytes: Arc<[u8]>,
}

/// Encoded gateway virtual hosts (`virtual_hosts` fields), by a hash of their host, port
/// and route runs (which the entries hold, so that their addresses stay theirs): the
/// gateway views of a push, and of the next, share them, and so do the VHDS resources
/// made from them.
pub(super) type GatewayHostMemo = Generations<u64, Vec<GatewayHostField>>;

pub(super) struct GatewayHostField {
    host: String,
    more_hosts: Vec<String>,
    port: u32,
    require_tls: bool,
    runs: Vec<Arc<[u8]>>,
    field: Arc<[u8]>,
}

impl ResourceCache {
    /// The gateway routes part of [`ResourceCache::retain_services_of`].
    pub(super) fn retain_gateway_routes(
        &self,
        ctx: &PushContext,
        changed: Option<&BTreeSet<ObjectKey>>,
    ) {
        let routing_changed = changed.is_none_or(|keys| {
            (keys.iter()).any(|k| matches!(k.kind, Kind::VirtualService | Kind::Gateway))
        });
        let mut gateway_routes = self.gateway_routes.lock().unwrap();
        // Routes without their own retries were built with MeshConfig's default policy.
        let retries = &ctx.mesh.default_http_retry_policy;
        let mut built_with = self.gateway_routes_retries.lock().unwrap();
        if *built_with != *retries {
            gateway_routes.clear();
            built_with.clone_from(retries);
        }
        if !routing_changed || gateway_routes.is_empty() {
            return;
        }
        let virtual_services: HashMap<&ObjectKey, &Arc<ConfigObject>> =
            (ctx.virtual_services.iter())
                .map(|vs| (&vs.key, vs))
                .collect();
        // Each Gateway's server ports, by `namespace/name`.
        let servers: HashMap<String, Vec<u32>> = (ctx.gateways.iter())
            .filter_map(|g| match &g.spec {
                Spec::Gateway(spec) => Some((
                    g.key.namespaced_name(),
                    spec.servers.iter().map(|s| s.port.number).collect(),
                )),
                _ => None,
            })
            .collect();
        gateway_routes.retain(|_, entries| {
            entries.retain(|e| {
                // A changed VirtualService's entries can never be read again.
                let vs = virtual_services.get(&e.vs.key);
                vs.is_some_and(|vs| same(Some(vs), Some(&e.vs)))
                    && (servers.get(&*e.gateway)).is_some_and(|ports| ports.contains(&e.port))
            });
            !entries.is_empty()
        });
    }

    /// The encoded routes `routes` gives a gateway: cached unless they depend on the
    /// proxy, and valid while the VirtualService and the services and DestinationRules of
    /// its destinations are the ones they were built from.
    fn gateway_routes(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        routes: &GatewayRoutes,
    ) -> Arc<[u8]> {
        if !routes.shared() {
            return encode_routes(&routes.build(ctx, proxy)).into();
        }
        let key = gateway_routes_key(routes);
        let is = |e: &GatewayRoutesEntry| {
            e.port == routes.port && *e.gateway == *routes.gateway && e.vs.key == routes.vs.key
        };
        {
            let mut cached = self.gateway_routes.lock().unwrap();
            let found = (cached.get_mut(&key).into_iter().flatten())
                .filter(|e| is(e) && same(Some(&e.vs), Some(routes.vs)))
                .find_map(|e| {
                    if !e.destinations.iter_mut().all(|d| d.unchanged(ctx, proxy)) {
                        return None;
                    }
                    // Later readers of this push compare pointers only.
                    e.vs = routes.vs.clone();
                    Some(e.bytes.clone())
                });
            if let Some(bytes) = found {
                self.hits.inc();
                return bytes;
            }
        }
        self.misses.inc();
        let bytes: Arc<[u8]> = encode_routes(&routes.build(ctx, proxy)).into();
        let destinations = translate::route::destination_hosts(routes.vs)
            .into_iter()
            .map(|host| Destination::now(ctx, proxy, host))
            .collect();
        let mut cached = self.gateway_routes.lock().unwrap();
        let entries = cached.entry(key).or_default();
        // What earlier contexts built for this VirtualService and server is stale.
        entries.retain(|e| !(is(e) && e.ctx != ctx.id()));
        entries.push(GatewayRoutesEntry {
            port: routes.port,
            gateway: routes.gateway.into(),
            ctx: ctx.id(),
            vs: routes.vs.clone(),
            destinations,
            bytes: bytes.clone(),
        });
        bytes
    }

    /// A gateway's virtual host as an encoded `virtual_hosts` field: its name and domain,
    /// the cached routes of each VirtualService (`ResourceCache::gateway_routes`), then
    /// the fields after the routes; shared with the views of this context and the last.
    pub fn gateway_virtual_host(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        vh: &GatewayVirtualHost,
    ) -> Arc<[u8]> {
        let runs: Vec<Arc<[u8]>> = (vh.sources.iter())
            .map(|s| self.gateway_routes(ctx, proxy, s))
            .collect();
        let key = {
            use std::hash::{BuildHasher, Hash, Hasher};
            let mut h = foldhash::fast::FixedState::default().build_hasher();
            (&vh.host, &vh.more_hosts, vh.port, vh.require_tls).hash(&mut h);
            for r in &runs {
                (Arc::as_ptr(r) as *const u8 as usize).hash(&mut h);
            }
            h.finish()
        };
        let mut memo = self.gateway_hosts.lock().unwrap();
        let fields = memo.get(ctx.id(), key, Vec::new);
        let found = fields.iter().find(|f| {
            f.host == vh.host
                && f.more_hosts == vh.more_hosts
                && f.port == vh.port
                && f.require_tls == vh.require_tls
                && f.runs.len() == runs.len()
                && f.runs.iter().zip(&runs).all(|(a, b)| Arc::ptr_eq(a, b))
        });
        if let Some(f) = found {
            return f.field.clone();
        }
        let head = vh.head().encode_to_vec();
        let tail = vh.tail().encode_to_vec();
        let len = head.len() + runs.iter().map(|r| r.len()).sum::<usize>() + tail.len();
        let mut out = Vec::with_capacity(len + 8);
        prost::encoding::encode_key(
            VIRTUAL_HOSTS,
            prost::encoding::WireType::LengthDelimited,
            &mut out,
        );
        prost::encoding::encode_varint(len as u64, &mut out);
        out.extend_from_slice(&head);
        for r in &runs {
            out.extend_from_slice(r);
        }
        out.extend_from_slice(&tail);
        let field: Arc<[u8]> = out.into();
        fields.push(GatewayHostField {
            host: vh.host.clone(),
            more_hosts: vh.more_hosts.clone(),
            port: vh.port,
            require_tls: vh.require_tls,
            runs,
            field: field.clone(),
        });
        field
    }
}

/// Where [`ResourceCache::gateway_routes`] files the routes of one VirtualService at one
/// gateway server.
fn gateway_routes_key(routes: &GatewayRoutes) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one((&routes.vs.key, routes.port, routes.gateway))
}
