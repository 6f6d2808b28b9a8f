//! Push-pipeline micro-benchmarks: building the shared push context, and generating plus
//! encoding everything one unscoped sidecar receives. Figures live in BENCHMARKS.md.

use std::collections::BTreeSet;
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group};
use serde_json::json;

use model::config::ObjectKey;
use model::config::parse::parse_file;
use model::testmesh::{Load, Shape, generate};
use model::{Proxy, PushContext, Store};
use prost::Message;
use translate::proxy_config;
use xds::cache::{self, ResourceCache};
use xds::resource::View;

/// The allocator the `meshd` binary ships with, so the figures are what it does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `store` (a generated mesh of `services` over 50 namespaces) with one endpoint added to
/// svc-1, and the keys that changed, as the sources report them (only what differs).
fn one_endpoint_added(store: &Store, services: usize) -> (Store, BTreeSet<ObjectKey>) {
    let shape = Shape::new(services, 50, 3);
    let (changed, keys) = changed(store, &shape.service_yaml(1, Some("10.200.0.1")));
    assert_eq!(keys.len(), 1, "one EndpointSlice");
    (changed, keys)
}

/// `store` with the objects of `yaml` applied, and the keys that changed.
fn changed(store: &Store, yaml: &str) -> (Store, BTreeSet<ObjectKey>) {
    let mut changed = store.clone();
    let mut keys = BTreeSet::new();
    for o in parse_file("change.yaml", yaml).objects {
        let key = o.key.clone();
        if changed.apply(o) {
            keys.insert(key);
        }
    }
    (changed, keys)
}

/// Push contexts for a mesh alternating between `store` and `store` with one endpoint
/// more ([`one_endpoint_added`]) or another change, each updated from the one before, as
/// the pipeline does (unchanged services stay the same `Arc`s).
struct Alternating {
    stores: [Store; 2],
    keys: BTreeSet<ObjectKey>,
    previous: Arc<PushContext>,
    turn: usize,
}

impl Alternating {
    /// `store` holds the mesh of `generate(services, 50, 3)` (and possibly more),
    /// `first` is its context.
    fn new(store: Store, services: usize, first: PushContext) -> Alternating {
        let (changed, keys) = one_endpoint_added(&store, services);
        Alternating::between(store, changed, keys, first)
    }

    /// Alternating between `store` and `changed`, which differ in `keys`.
    fn between(
        store: Store,
        changed: Store,
        keys: BTreeSet<ObjectKey>,
        first: PushContext,
    ) -> Alternating {
        Alternating {
            stores: [store, changed],
            keys,
            previous: Arc::new(first),
            turn: 0,
        }
    }

    fn next(&mut self) -> Arc<PushContext> {
        self.turn += 1;
        let store = &self.stores[self.turn % 2];
        self.previous = Arc::new(self.previous.update(store, &self.keys, "bench/3".into()));
        self.previous.clone()
    }
}

fn push_context_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_context_build");
    group.sample_size(20);
    for services in [1_000, 10_000] {
        let store = generate(services, 50, 3);
        group.bench_with_input(BenchmarkId::from_parameter(services), &store, |b, store| {
            b.iter(|| PushContext::build(store, "bench/1".into()))
        });
    }
    group.finish();
    // Target 1b: the next push's context after one service's endpoints changed, updated
    // from the previous context (what the push pipeline does) instead of built in full.
    let mut group = c.benchmark_group("push_context_update");
    group.sample_size(50);
    for services in [1_000, 10_000] {
        let store = generate(services, 50, 3);
        let before = PushContext::build(&store, "bench/1".into());
        let (changed_store, changed) = one_endpoint_added(&store, services);
        group.bench_function(BenchmarkId::new("one_endpoint_change", services), |b| {
            b.iter(|| before.update(&changed_store, &changed, "bench/2".into()))
        });
    }
    group.finish();
}

fn sidecar_generation(c: &mut Criterion) {
    let store = generate(1_000, 50, 3);
    let ctx = PushContext::build(&store, "bench/1".into());
    let sidecar = |ns: &str| {
        let meta = json!({"NAMESPACE": ns, "LABELS": {"app": "client"}});
        Proxy::from_node(
            &format!("sidecar~10.9.0.1~client-0.{ns}~{ns}.svc.cluster.local"),
            meta.as_object().unwrap(),
        )
        .unwrap()
    };
    let proxy = sidecar("ns-1");
    let mut group = c.benchmark_group("sidecar_generation");
    group.sample_size(20);
    group.bench_function("1000_services_translate_and_encode", |b| {
        b.iter(|| View::new(proxy_config(&ctx, &proxy)))
    });
    // The DNS name table a sidecar whose agent runs a DNS proxy also gets (NDS): built
    // and encoded for each such view of each push.
    group.bench_function("1000_services_name_table", |b| {
        b.iter(|| {
            let services = translate::services(&ctx, &proxy);
            translate::name_table::name_table(&proxy, &services).encode_to_vec()
        })
    });
    // The part of a cached view that is not cached: which services, listeners, the
    // VirtualService routes.
    group.bench_function("1000_services_plan_only", |b| {
        b.iter(|| translate::plan(&ctx, &proxy).services.len())
    });
    // What a push costs per view once the per-service cache holds the mesh and the push
    // has built one view: the unscoped sidecars of the 50 namespaces in turn (views of
    // one push share their cluster and load-assignment sets; the plan, listeners and
    // route configuration are each view's own).
    let cache = ResourceCache::default();
    let namespaces: Vec<Proxy> = (0..50).map(|n| sidecar(&format!("ns-{n}"))).collect();
    for p in &namespaces {
        cache::view(&ctx, p, &cache);
    }
    let mut turn = 0;
    group.bench_function("1000_services_cached", |b| {
        b.iter(|| {
            turn += 1;
            cache::view(&ctx, &namespaces[turn % namespaces.len()], &cache)
        })
    });
    // The same views for sidecars whose agents run a DNS proxy: each also holds the name
    // table, assembled from the services' cached entries.
    let dns: Vec<Proxy> = (namespaces.iter().cloned())
        .map(|p| Proxy {
            dns_proxy: true,
            ..p
        })
        .collect();
    for p in &dns {
        cache::view(&ctx, p, &cache);
    }
    group.bench_function("1000_services_cached_with_name_table", |b| {
        b.iter(|| {
            turn += 1;
            cache::view(&ctx, &dns[turn % dns.len()], &cache)
        })
    });
    // What each proxy pays per push to find its view once the push has built it (the
    // key from the proxy's own fields, then the lookup): the 50 namespaces' sidecars in
    // turn.
    let push = xds::push::Push::new(
        ctx.update(&store, &BTreeSet::new(), "bench/3".into()),
        3,
        std::time::Instant::now(),
        None,
        Arc::new(ResourceCache::default()),
    );
    for p in &namespaces {
        push.view(p);
    }
    group.bench_function("1000_services_a_pushs_view_found_again", |b| {
        b.iter(|| {
            turn += 1;
            push.view(&namespaces[turn % namespaces.len()])
        })
    });
    // The first view of a later push of an unchanged mesh: every service's resources are
    // cached, the view's sets are assembled from them.
    group.bench_function("1000_services_first_view_of_a_push", |b| {
        b.iter_batched(
            || ctx.update(&store, &BTreeSet::new(), "bench/2".into()),
            |next| {
                let view = cache::view(&next, &proxy, &cache);
                (next, view)
            },
            BatchSize::SmallInput,
        )
    });
    // The same for a sidecar whose agent runs a DNS proxy: its name table assembled from
    // the services' cached entries (the first view of each service list of a push).
    let dns_proxy = Proxy {
        dns_proxy: true,
        ..proxy.clone()
    };
    cache::view(&ctx, &dns_proxy, &cache);
    group.bench_function("1000_services_first_view_of_a_push_with_name_table", |b| {
        b.iter_batched(
            || ctx.update(&store, &BTreeSet::new(), "bench/2".into()),
            |next| {
                let view = cache::view(&next, &dns_proxy, &cache);
                (next, view)
            },
            BatchSize::SmallInput,
        )
    });
    // The first view of a push after a one-service change: each push's context is updated
    // from the previous one as the pipeline does (unchanged services are the same
    // `Arc`s), the mesh alternating between two states that differ in one service's
    // endpoints, so each view re-encodes that service and finds the other 999 unchanged.
    let mut contexts = Alternating::new(store, 1_000, ctx);
    group.bench_function("1000_services_after_one_service_change", |b| {
        b.iter_batched(
            || contexts.next(),
            |next| {
                let view = cache::view(&next, &proxy, &cache);
                (next, view)
            },
            BatchSize::SmallInput,
        )
    });
    // The same, as a push whose change was endpoints only builds it (since session 25):
    // the listeners and routes of the view before kept, clusters and load assignments
    // assembled again.
    let before = cache::view(&contexts.next(), &proxy, &cache);
    group.bench_function("1000_services_after_one_endpoint_change_kept", |b| {
        b.iter_batched(
            || contexts.next(),
            |next| {
                let view = cache::view_after_endpoints(&next, &proxy, &cache, &before);
                (next, view)
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// istiod's published reference: 11 ms to build a push context for 1,000 gateway
/// VirtualServices. The bench mesh (1,000 services) with a VirtualService per service
/// bound to the ingress Gateway, each its own host: the full build, and what the gateway
/// is sent (`http.80` holds 1,000 virtual hosts), translated and encoded, then cached.
fn gateway_virtual_services(c: &mut Criterion) {
    let shape = Shape::new(1_000, 50, 3);
    let mut store = shape.store();
    let yaml: String = (0..1_000).map(|i| shape.gateway_routing_yaml(i)).collect();
    let parsed = parse_file("gateway.yaml", &yaml);
    assert!(parsed.errors().next().is_none(), "{:?}", parsed.issues);
    for o in parsed.objects {
        store.apply(o);
    }
    let mut group = c.benchmark_group("push_context_build");
    group.sample_size(20);
    group.bench_function("1000_gateway_virtual_services", |b| {
        b.iter(|| PushContext::build(&store, "bench/1".into()))
    });
    group.finish();

    let ctx = PushContext::build(&store, "bench/1".into());
    let meta = json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}});
    let gateway = Proxy::from_node(
        "router~10.9.0.2~ingress-0.istio-system~istio-system.svc.cluster.local",
        meta.as_object().unwrap(),
    )
    .unwrap();
    let config = proxy_config(&ctx, &gateway);
    assert_eq!(config.routes[0].virtual_hosts.len(), 1_000, "one per host");
    let mut group = c.benchmark_group("gateway_generation");
    group.sample_size(20);
    group.bench_function("1000_virtual_services_translate_and_encode", |b| {
        b.iter(|| View::new(proxy_config(&ctx, &gateway)))
    });
    let cache = ResourceCache::default();
    let before = cache::view(&ctx, &gateway, &cache);
    group.bench_function("1000_virtual_services_cached", |b| {
        b.iter(|| cache::view(&ctx, &gateway, &cache))
    });
    // The push after one VirtualService changed: its routes translated again, every other
    // VirtualService's taken from the cache.
    let edited = shape
        .gateway_routing_yaml(1)
        .replace("prefix: /api", "prefix: /v2");
    let (edited, keys) = changed(&store, &edited);
    assert_eq!(keys.len(), 1, "one VirtualService");
    let first = PushContext::build(&store, "bench/1".into());
    let mut contexts = Alternating::between(store.clone(), edited, keys, first);
    group.bench_function(
        "1000_virtual_services_after_one_virtual_service_change",
        |b| {
            b.iter_batched(
                || contexts.next(),
                |next| {
                    let view = cache::view(&next, &gateway, &cache);
                    (next, view)
                },
                BatchSize::SmallInput,
            )
        },
    );
    // The push after one endpoint change (the context updated from the previous one, as
    // the pipeline does): the gateway's listeners, routes and secrets are the previous
    // view's, its clusters and load assignments assembled again.
    let mut contexts = Alternating::new(store, 1_000, ctx);
    group.bench_function("1000_virtual_services_after_one_endpoint_change", |b| {
        b.iter_batched(
            || contexts.next(),
            |next| {
                let view = cache::view_after_endpoints(&next, &gateway, &cache, &before);
                (next, view)
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(
    benches,
    push_context_build,
    sidecar_generation,
    gateway_virtual_services
);

fn main() {
    // The heap as meshd runs it (src/main.rs): without transparent huge pages.
    meshd::heap::disable_huge_pages_unless_configured();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
