//! A proxy's view assembled from the cache: the translation's plan, with each service's
//! clusters, load assignments and default virtual host taken encoded from the cache.

use super::*;

/// The encoded configuration for `proxy`: what [`View::new`] of
/// [`translate::proxy_config`] holds, byte for byte, with the per-service parts from
/// `cache`.
pub fn view(ctx: &PushContext, proxy: &Proxy, cache: &ResourceCache) -> View {
    let plan = translate::plan(ctx, proxy);
    let mut view = clusters_and_endpoints(ctx, proxy, cache, &plan);
    view.encode_all(&[], &[], &plan.listeners, &[], &plan.secrets);
    for r in &plan.sidecar_routes {
        let port = r.port;
        // Each virtual host as an encoded `virtual_hosts` field, most of them cached.
        let virtual_hosts = (r.vhosts.iter().map(|v| match v {
            VirtualHostPlan::Default(svc) => {
                let rule = ctx.service_rule(proxy, svc);
                let audience = Audience::new(svc, proxy, r.sniffed);
                cache.default_virtual_host(ctx, svc, rule, port, audience)
            }
            VirtualHostPlan::Shared { vs, service } => {
                cache.routed_virtual_host(ctx, service, vs, port, proxy, r.sniffed)
            }
            VirtualHostPlan::Routed(vh) => virtual_host_field(vh).into(),
        }))
        .chain(
            (plan.catch_all.as_ref())
                .filter(|_| !r.sniffed)
                .map(|c| virtual_host_field(c).into()),
        );
        insert_route_configuration(&mut view, ctx, proxy, cache, &r.name, virtual_hosts);
    }
    for r in &plan.gateway_routes {
        let vhosts = translate::route::gateway_plan(ctx, proxy, &r.servers);
        let fields: Vec<Arc<[u8]>> = if vhosts.is_empty() {
            let blackhole = translate::route::gateway_blackhole(r.listen_port);
            vec![virtual_host_field(&blackhole).into()]
        } else {
            (vhosts.iter())
                .map(|vh| cache.gateway_virtual_host(ctx, proxy, vh))
                .collect()
        };
        insert_route_configuration(&mut view, ctx, proxy, cache, &r.name, fields);
    }
    insert_name_table(&mut view, ctx, proxy, cache, &plan);
    view
}

/// Adds the DNS name table of a proxy whose agent runs a DNS proxy.
pub(super) fn insert_name_table(
    view: &mut View,
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    plan: &translate::Plan,
) {
    if proxy.dns_proxy {
        view.insert(
            TypeKind::NameTable,
            cache.name_table(ctx, proxy, &plan.services),
        );
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

/// A view holding the plan's clusters and load assignments, the per-service ones from
/// `cache`.
pub(super) fn clusters_and_endpoints(
    ctx: &PushContext,
    proxy: &Proxy,
    cache: &ResourceCache,
    plan: &translate::Plan,
) -> View {
    let mut view = View::default();
    let own = plan.clusters.iter().map(encode_cluster).collect();
    let own_endpoints = plan.endpoints.iter().map(encode_assignment).collect();
    let at = locality::place(ctx, proxy);
    let own = (own, own_endpoints);
    let (clusters, endpoints) = cache.sets(ctx, proxy, &plan.services, &at, own);
    view.share(TypeKind::Cluster, clusters);
    view.share(TypeKind::Endpoint, endpoints);
    view
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
    let plan = translate::cluster_plan(ctx, proxy);
    let mut view = clusters_and_endpoints(ctx, proxy, cache, &plan);
    for kind in [
        TypeKind::Listener,
        TypeKind::Route,
        TypeKind::VirtualHost,
        TypeKind::Secret,
    ] {
        view.share(kind, previous.set(kind));
    }
    if translate::name_table::reads_endpoints(&plan.services) {
        insert_name_table(&mut view, ctx, proxy, cache, &plan);
    } else {
        view.share(TypeKind::NameTable, previous.set(TypeKind::NameTable));
    }
    view
}

/// A virtual host of `route_config` as a VHDS resource, from its encoded `virtual_hosts`
/// field: the message renamed [`translate::route::vhds_name`], byte for byte what
/// encoding the renamed virtual host gives (the name is its first field).
pub(super) fn vhds_resource(route_config: &str, field: &[u8]) -> Arc<Resource> {
    use prost::encoding::{decode_varint, encode_varint};
    let mut rest = field;
    let key = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    let len = decode_varint(&mut rest).expect("BUG: a virtual_hosts field");
    debug_assert_eq!(
        (key, len as usize),
        (u64::from(VIRTUAL_HOSTS << 3 | 2), rest.len())
    );
    let mut body = rest;
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
