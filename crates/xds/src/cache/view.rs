//! A proxy's view: translate's one assembler ([`translate::assemble`]) into the cache, an
//! [`translate::Assembly`] whose per-service parts (clusters and load assignments,
//! default and shared virtual hosts, a gateway's virtual hosts, name-table entries) are
//! taken encoded from the memo and whose other parts are encoded as they come.

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::listener::v3::Listener;
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use translate::route::{GatewayVirtualHost, RouteHeaders};

use super::*;

/// The encoded configuration for `proxy`: [`translate::assemble`] with the per-service
/// parts taken from `cache`, so that it holds what [`View::new`] of
/// [`translate::proxy_config`] holds, byte for byte.
pub fn view(ctx: &PushContext, proxy: &Proxy, cache: &ResourceCache) -> View {
    let mut cached = Cached {
        cache,
        view: View::default(),
    };
    translate::assemble(ctx, proxy, &mut cached);
    cached.view
}

/// The cache as a [`translate::Assembly`]: each per-service part encoded once and shared
/// between the views that hold it, the rest encoded as it comes.
struct Cached<'a> {
    cache: &'a ResourceCache,
    view: View,
}

impl translate::Assembly for Cached<'_> {
    /// An encoded `virtual_hosts` field of a route configuration.
    type VirtualHost = Arc<[u8]>;

    fn clusters(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        services: &[&Arc<Service>],
        clusters: Vec<Cluster>,
        endpoints: Vec<ClusterLoadAssignment>,
    ) {
        let own = clusters.iter().map(encode_cluster).collect();
        let own_endpoints = endpoints.iter().map(encode_assignment).collect();
        let at = locality::place(ctx, proxy);
        let (clusters, endpoints) =
            (self.cache).sets(ctx, proxy, services, &at, (own, own_endpoints));
        self.view.share(TypeKind::Cluster, clusters);
        self.view.share(TypeKind::Endpoint, endpoints);
    }

    fn listeners(&mut self, listeners: Vec<Listener>) {
        self.view.encode_all(&[], &[], &listeners, &[], &[]);
    }

    fn secrets(&mut self, secrets: Vec<Secret>) {
        self.view.encode_all(&[], &[], &[], &[], &secrets);
    }

    fn default_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> Arc<[u8]> {
        let rule = ctx.service_rule(proxy, svc);
        let audience = Audience::new(svc, proxy, sniffed);
        (self.cache).default_virtual_host(ctx, svc, rule, port, audience)
    }

    fn shared_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vs: &Arc<ConfigObject>,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> Arc<[u8]> {
        (self.cache).routed_virtual_host(ctx, svc, vs, port, proxy, sniffed)
    }

    fn gateway_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vh: &GatewayVirtualHost,
    ) -> Arc<[u8]> {
        self.cache.gateway_virtual_host(ctx, proxy, vh)
    }

    fn virtual_host(&mut self, vh: &VirtualHost) -> Arc<[u8]> {
        virtual_host_field(vh).into()
    }

    fn route_configuration(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        name: &str,
        mut virtual_hosts: Vec<Arc<[u8]>>,
        headers: Option<RouteHeaders>,
    ) {
        if let Some(headers) = headers {
            for field in &mut virtual_hosts {
                *field = with_route_headers(field, headers).into();
            }
        }
        insert_route_configuration(&mut self.view, ctx, proxy, self.cache, name, virtual_hosts);
    }

    fn name_table(&mut self, ctx: &PushContext, proxy: &Proxy, services: &[&Arc<Service>]) {
        let table = self.cache.name_table(ctx, proxy, services);
        self.view.insert(TypeKind::NameTable, table);
    }
}

impl ResourceCache {
    /// [`translate::name_table::name_table`] encoded, byte for byte, from each service's
    /// encoded entries: a map's entries are occurrences of its field, written in key
    /// order, and those of a service that is not headless are encoded once and shared.
    pub(super) fn name_table(
        &self,
        ctx: &PushContext,
        proxy: &Proxy,
        services: &[&Arc<Service>],
    ) -> Arc<Resource> {
        use translate::name_table::reads_endpoints;
        let ptrs: Vec<usize> = services.iter().map(|s| Arc::as_ptr(*s) as usize).collect();
        let network = reads_endpoints(services).then(|| proxy.network.clone());
        let found = (self.tables.lock().unwrap().iter())
            .find(|e| e.ctx == ctx.id() && e.services == ptrs && e.network == network)
            .filter(|e| e.auto == proxy.auto_addresses)
            .map(|e| e.table.clone());
        if let Some(table) = found {
            return table;
        }
        let table = self.assemble_name_table(proxy, services);
        let mut tables = self.tables.lock().unwrap();
        // The newest two contexts' tables, as the cluster sets are kept.
        let mut contexts: Vec<u64> = (tables.iter().map(|e| e.ctx)).chain([ctx.id()]).collect();
        contexts.sort_unstable();
        contexts.dedup();
        let oldest_kept = contexts[contexts.len().saturating_sub(SET_CONTEXTS)];
        tables.retain(|e| e.ctx >= oldest_kept);
        tables.push(TableEntry {
            ctx: ctx.id(),
            services: ptrs,
            network,
            auto: proxy.auto_addresses,
            table: table.clone(),
        });
        table
    }

    /// The name table assembled from each service's cached entries.
    pub(super) fn assemble_name_table(
        &self,
        proxy: &Proxy,
        services: &[&Arc<Service>],
    ) -> Arc<Resource> {
        use std::borrow::Cow;
        use translate::name_table::{NameTable, entries, is_headless};
        let encoded = |entries: Vec<(String, _)>| -> Vec<(String, Arc<[u8]>)> {
            (entries.into_iter())
                .map(|(key, info)| {
                    let one = NameTable {
                        table: [(key.clone(), info)].into(),
                    };
                    (key, one.encode_to_vec().into())
                })
                .collect()
        };
        let mut pieces: Vec<(Cow<'_, str>, Arc<[u8]>)> = Vec::with_capacity(services.len());
        let mut names = self.names.lock().unwrap();
        for svc in services {
            if is_headless(svc) {
                let own = encoded(entries(proxy, svc));
                pieces.extend(own.into_iter().map(|(k, b)| (Cow::Owned(k), b)));
                continue;
            }
            let auto = svc.auto_for(proxy.auto_addresses);
            let bytes = match names.get_mut(svc, auto) {
                Some((built, bytes)) if same(Some(&*built), Some(svc)) => {
                    *built = (*svc).clone();
                    bytes.clone()
                }
                _ => {
                    // One entry or none: the service's host.
                    let bytes: Arc<[u8]> = (encoded(entries(proxy, svc)).pop())
                        .map_or_else(|| Arc::from(&[][..]), |(_, b)| b);
                    names.insert(svc, auto, bytes.clone());
                    bytes
                }
            };
            if !bytes.is_empty() {
                pieces.push((Cow::Borrowed(&svc.hostname), bytes));
            }
        }
        drop(names);
        // In key order (the services are; a headless one's Pods may not be); of equal
        // keys the later stays, as in the map.
        pieces.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<Arc<[u8]>> = Vec::with_capacity(pieces.len());
        let mut pieces = pieces.into_iter().peekable();
        while let Some((key, bytes)) = pieces.next() {
            if pieces.peek().is_none_or(|(next, _)| *next != key) {
                kept.push(bytes);
            }
        }
        from_pieces::<NameTable>("", kept)
    }
}

/// Adds the route configuration `name` holding these encoded virtual hosts: kept as its
/// pieces, so the shared virtual hosts are not copied into every view's route
/// configuration; for a proxy on VHDS, its shell and each virtual host as a resource.
pub(super) fn insert_route_configuration(
    view: &mut View,
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    name: &str,
    virtual_hosts: impl IntoIterator<Item = Arc<[u8]>>,
) {
    if proxy.vhds {
        let shell = translate::route::vhds_shell(name.to_string());
        view.insert(TypeKind::Route, encode(name, &shell));
        for field in virtual_hosts {
            let vh = cache.vhds_virtual_host(ctx, name, &field);
            view.insert(TypeKind::VirtualHost, vh);
        }
        return;
    }
    let head = RouteConfiguration {
        name: name.to_string(),
        ..Default::default()
    }
    .encode_to_vec();
    let tail = translate::route::with_virtual_hosts(String::new(), Vec::new()).encode_to_vec();
    let mut pieces: Vec<Arc<[u8]>> = vec![head.into()];
    pieces.extend(virtual_hosts);
    pieces.push(tail.into());
    view.insert(
        TypeKind::Route,
        from_pieces::<RouteConfiguration>(name, pieces),
    );
}

/// A view after a push that changed endpoints only: [`view`] byte for byte, with the
/// listeners, routes, virtual hosts and secrets of `previous` (the same view key's view
/// of the push before) shared rather than translated again, as none of them depends on
/// endpoints ([`translate::cluster_plan`]; the caller checks a sidecar's inbound ports).
/// The name table does when the proxy may reach a headless service (whose entry is its
/// endpoints): it is built again then, and kept otherwise.
/// A gateway bound to many VirtualServices is most of a push's translation otherwise
/// (1,000 virtual hosts on the benchmarks' gateway), and a sidecar's plan most of its view.
pub fn view_after_endpoints(
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    previous: &View,
) -> View {
    let mut cached = Cached {
        cache,
        view: View::default(),
    };
    let name_table = translate::assemble_clusters(ctx, proxy, &mut cached);
    let mut view = cached.view;
    for kind in [
        TypeKind::Listener,
        TypeKind::Route,
        TypeKind::VirtualHost,
        TypeKind::Secret,
    ] {
        view.share(kind, previous.set(kind));
    }
    if !name_table {
        view.share(TypeKind::NameTable, previous.set(TypeKind::NameTable));
    }
    view
}

/// An encoded `virtual_hosts` field with what a proxy's `headers` change in it: the
/// shared encoding decoded, changed and encoded again (only for proxies whose
/// `proxyHeaders` set `attemptCount` or `xForwardedHost`).
fn with_route_headers(field: &[u8], headers: RouteHeaders) -> Vec<u8> {
    let mut vh =
        VirtualHost::decode(virtual_host_body(field)).expect("BUG: an encoded virtual host");
    headers.apply(&mut vh);
    virtual_host_field(&vh)
}

/// The encoded virtual host inside an encoded `virtual_hosts` field (past its key and
/// length).
fn virtual_host_body(field: &[u8]) -> &[u8] {
    use prost::encoding::decode_varint;
    let mut rest = field;
    let key = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    let len = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    debug_assert_eq!(
        (key, len as usize),
        (u64::from(VIRTUAL_HOSTS << 3 | 2), rest.len())
    );
    rest
}

/// A virtual host of `route_config` as a VHDS resource, from its encoded `virtual_hosts`
/// field: the message renamed [`translate::route::vhds_name`], byte for byte what
/// encoding the renamed virtual host gives (the name is its first field).
pub(super) fn vhds_resource(route_config: &str, field: &[u8]) -> Arc<Resource> {
    use prost::encoding::{decode_varint, encode_varint};
    let mut body = virtual_host_body(field);
    let mut old_name = "";
    if body.first() == Some(&0x0a) {
        body = &body[1..];
        let n = decode_varint(&mut body).expect("BUG: a virtual host's name") as usize;
        old_name = std::str::from_utf8(&body[..n]).expect("BUG: a name is UTF-8");
        body = &body[n..];
    }
    let name = translate::route::vhds_name(route_config, old_name);
    let mut out = Vec::with_capacity(name.len() + 4 + body.len());
    out.push(0x0a);
    encode_varint(name.len() as u64, &mut out);
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(body);
    from_bytes::<VirtualHost>(&name, out)
}
