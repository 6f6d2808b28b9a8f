//! Building a push context from the store, and updating it after a change: the indexes
//! rebuilt only where the changed objects reach, and the cross-object checks.

use super::*;

/// The objects of `kind`, oldest first, then by key.
pub(super) fn oldest_first(store: &Store, kind: Kind) -> Arc<Vec<Arc<ConfigObject>>> {
    let mut objects: Vec<_> = store.of_kind(kind).cloned().collect();
    by_age(&mut objects);
    Arc::new(objects)
}

/// `old` again, or `build()` when its inputs changed.
pub(super) fn rebuilt_if<T: Clone>(changed: bool, old: &T, build: impl FnOnce() -> T) -> T {
    if changed { build() } else { old.clone() }
}

/// The root VirtualServices with their delegates merged in, and the delegates' names.
pub(super) fn virtual_services(
    store: &Store,
    mesh: &MeshConfig,
) -> (Arc<Vec<Arc<ConfigObject>>>, Arc<Delegated>) {
    let default = &mesh.default_virtual_service_export_to;
    let merged = crate::delegate::merge(&oldest_first(store, Kind::VirtualService), default);
    (Arc::new(merged.roots), Arc::new(merged.delegated))
}

pub(super) fn sidecars(store: &Store) -> Arc<Vec<Arc<ConfigObject>>> {
    Arc::new(store.of_kind(Kind::Sidecar).cloned().collect())
}

pub(super) fn destination_rules(store: &Store, mesh: &MeshConfig) -> Arc<DestinationRules> {
    let rules = store.of_kind(Kind::DestinationRule).cloned().collect();
    Arc::new(DestinationRules::new(rules, mesh))
}

pub(super) fn secrets(store: &Store) -> Arc<HashMap<(String, String), Arc<ConfigObject>>> {
    Arc::new(
        store
            .of_kind(Kind::Secret)
            .map(|o| ((o.key.namespace.clone(), o.key.name.clone()), o.clone()))
            .collect(),
    )
}

pub(super) fn namespace_labels(store: &Store) -> Arc<HashMap<String, BTreeMap<String, String>>> {
    Arc::new(
        store
            .of_kind(Kind::Namespace)
            .map(|n| (n.key.name.clone(), n.meta.labels.clone()))
            .collect(),
    )
}

/// The Kubernetes services (namespace, name) whose endpoints a change to these keys can
/// alter: the Service itself, the service an EndpointSlice belongs to now or belonged to
/// in `before`, and the services whose endpoints name a changed Pod.
pub(super) fn touched_services(
    before: &Store,
    store: &Store,
    changed: &BTreeSet<ObjectKey>,
) -> BTreeSet<(String, String)> {
    let mut touched = BTreeSet::new();
    for key in changed {
        let ns = &key.namespace;
        match key.kind {
            Kind::Service | Kind::Endpoints => {
                touched.insert((ns.clone(), key.name.clone()));
            }
            Kind::EndpointSlice => {
                for s in [before, store] {
                    if let Some(Spec::EndpointSlice(slice)) = s.get(key).map(|o| &o.spec) {
                        touched.insert((ns.clone(), slice.service_name.clone()));
                    }
                }
            }
            Kind::Pod => {
                let names_pod = |slice: &EndpointSliceDef| {
                    slice
                        .endpoints
                        .iter()
                        .any(|e| e.pod.as_deref() == Some(key.name.as_str()))
                };
                for o in store.in_namespace(Kind::EndpointSlice, ns) {
                    if let Spec::EndpointSlice(slice) = &o.spec
                        && names_pod(slice)
                    {
                        touched.insert((ns.clone(), slice.service_name.clone()));
                    }
                }
                for o in store.in_namespace(Kind::Endpoints, ns) {
                    if let Spec::Endpoints(subsets) = &o.spec
                        && subsets.iter().any(names_pod)
                    {
                        touched.insert((ns.clone(), o.key.name.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    touched
}
impl PushContext {
    /// A push context from YAML that must be free of errors (tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn from_yaml(yaml: &str) -> PushContext {
        PushContext::build(&crate::testmesh::store_of("test.yaml", yaml), "v/1".into())
    }

    pub fn build(store: &Store, version: String) -> PushContext {
        let mesh = MeshConfig::from_store(store);
        let (virtual_services, delegated) = virtual_services(store, &mesh);
        let networks = Arc::new(NetworkGateways::new(store, &mesh));
        let (services, shared_hosts, aliases) = build_services(store, &mesh);
        let mut ctx = PushContext {
            version: version.into(),
            id: ContextId::next(),
            store: store.clone(),
            services,
            shared_hosts: Arc::new(shared_hosts),
            aliases: Arc::new(aliases),
            virtual_services,
            delegated,
            destination_rules: destination_rules(store, &mesh),
            gateways: oldest_first(store, Kind::Gateway),
            sidecars: sidecars(store),
            peer_authentications: oldest_first(store, Kind::PeerAuthentication),
            request_authentications: oldest_first(store, Kind::RequestAuthentication),
            authorization_policies: oldest_first(store, Kind::AuthorizationPolicy),
            telemetries: oldest_first(store, Kind::Telemetry),
            secrets: secrets(store),
            pod_labels: {
                let mut by_namespace = PodLabels::default();
                for p in store.of_kind(Kind::Pod) {
                    (by_namespace.entry(p.key.namespace.clone()).or_default())
                        .insert(p.key.name.clone(), p.meta.labels.clone());
                }
                by_namespace
            },
            namespace_labels: namespace_labels(store),
            mesh,
            networks,
            issues: Arc::default(),
        };
        ctx.issues = Arc::new(ctx.cross_check());
        ctx
    }

    /// The context for `store`, which differs from the one `self` was built from in the
    /// objects `changed`: equal to [`PushContext::build`], in time proportional to the
    /// change. Kinds whose effect is not confined to known services (Nodes, which give
    /// every endpoint on them its locality; ServiceEntries and WorkloadEntries) build in
    /// full.
    pub fn update(&self, store: &Store, changed: &BTreeSet<ObjectKey>, version: String) -> Self {
        let any = |kind: Kind| changed.iter().any(|k| k.kind == kind);
        // A Namespace's annotations decide its services' traffic distribution: rare
        // enough to build in full, as Node changes are.
        if any(Kind::Node)
            || any(Kind::ServiceEntry)
            || any(Kind::WorkloadEntry)
            || any(Kind::Namespace)
        {
            return PushContext::build(store, version);
        }
        // A Pod a ServiceEntry's `workloadSelector` may select is one of its endpoints:
        // the namespaces with such entries, looked up once when Pods changed.
        if any(Kind::Pod) {
            let selecting: std::collections::HashSet<&str> = (store.of_kind(Kind::ServiceEntry))
                .filter(|o| matches!(&o.spec, Spec::ServiceEntry(se, _) if se.workload_selector.is_some()))
                .map(|o| o.key.namespace.as_str())
                .collect();
            if (changed.iter())
                .any(|k| k.kind == Kind::Pod && selecting.contains(k.namespace.as_str()))
            {
                return PushContext::build(store, version);
            }
        }
        let mesh = rebuilt_if(any(Kind::ConfigMap), &self.mesh, || {
            MeshConfig::from_store(store)
        });
        // MeshNetworks decide endpoints' networks, as a Namespace's labels do.
        if mesh.mesh_networks != self.mesh.mesh_networks {
            return PushContext::build(store, version);
        }
        let mut services = self.services.clone();
        let mut hosts_changed = false;
        let endpoint_networks = EndpointNetworks::new(store, &mesh);
        for (ns, name) in touched_services(&self.store, store, changed) {
            let host = kubernetes_hostname(&ns, &name);
            // A ServiceEntry declares the host too: the choice between them is the full
            // build's.
            if self.shared_hosts.get(&host).is_some() {
                return PushContext::build(store, version);
            }
            let built = store
                .get(&ObjectKey::new(Kind::Service, &ns, &name))
                .and_then(|o| kubernetes_service(o, store, &endpoint_networks));
            // An ExternalName Service, before or now, changes which hosts have aliases.
            let old = self.services.get(&host);
            if old.is_some_and(|s| s.alias_for.is_some())
                || built.as_ref().is_some_and(|s| s.alias_for.is_some())
            {
                return PushContext::build(store, version);
            }
            let built = built.map(|mut svc| {
                svc.aliases = self.aliases.get(&host).cloned().unwrap_or_default();
                svc
            });
            match built {
                // Rebuilt but equal: keep the old `Arc`, which caches compare first.
                Some(svc) if self.services.get(&host).is_some_and(|old| **old == svc) => {}
                Some(svc) => hosts_changed |= services.insert(host, Arc::new(svc)).is_none(),
                None => hosts_changed |= services.remove(&host).is_some(),
            }
        }
        // A ServiceEntry may define a hostname a Kubernetes service gave up.
        if hosts_changed && store.of_kind(Kind::ServiceEntry).next().is_some() {
            return PushContext::build(store, version);
        }
        let mut pod_labels = self.pod_labels.clone();
        for key in changed.iter().filter(|k| k.kind == Kind::Pod) {
            let pods = pod_labels.entry(key.namespace.clone()).or_default();
            match store.get(key) {
                Some(pod) => pods.insert(key.name.clone(), pod.meta.labels.clone()),
                None => pods.remove(&key.name),
            };
            if pods.is_empty() {
                pod_labels.remove(&key.namespace);
            }
        }
        // A Service that is or was a gateway changes the networks' gateways.
        // A ConfigMap change may be MeshNetworks' gateway hostname resolving anew.
        let gateway_changed = any(Kind::ConfigMap)
            || changed.iter().any(|k| {
                k.kind == Kind::Service
                    && (self.networks.names_service(&k.namespace, &k.name)
                        || (store.get(k))
                            .is_some_and(|o| o.meta.labels.contains_key(NETWORK_LABEL)))
            });
        let networks = rebuilt_if(gateway_changed, &self.networks, || {
            let mut networks = NetworkGateways::new(store, &mesh);
            networks.remember(&self.networks);
            Arc::new(networks)
        });
        let (virtual_services, delegated) = rebuilt_if(
            any(Kind::VirtualService) || mesh != self.mesh,
            &(self.virtual_services.clone(), self.delegated.clone()),
            || virtual_services(store, &mesh),
        );
        // Each part: rebuilt when an object of its kind changed, else shared.
        let mut ctx = PushContext {
            version: version.into(),
            id: ContextId::next(),
            store: store.clone(),
            services,
            shared_hosts: self.shared_hosts.clone(),
            aliases: self.aliases.clone(),
            virtual_services,
            delegated,
            destination_rules: rebuilt_if(
                any(Kind::DestinationRule) || mesh != self.mesh,
                &self.destination_rules,
                || destination_rules(store, &mesh),
            ),
            gateways: rebuilt_if(any(Kind::Gateway), &self.gateways, || {
                oldest_first(store, Kind::Gateway)
            }),
            sidecars: rebuilt_if(any(Kind::Sidecar), &self.sidecars, || sidecars(store)),
            peer_authentications: rebuilt_if(
                any(Kind::PeerAuthentication),
                &self.peer_authentications,
                || oldest_first(store, Kind::PeerAuthentication),
            ),
            request_authentications: rebuilt_if(
                any(Kind::RequestAuthentication),
                &self.request_authentications,
                || oldest_first(store, Kind::RequestAuthentication),
            ),
            authorization_policies: rebuilt_if(
                any(Kind::AuthorizationPolicy),
                &self.authorization_policies,
                || oldest_first(store, Kind::AuthorizationPolicy),
            ),
            telemetries: rebuilt_if(any(Kind::Telemetry), &self.telemetries, || {
                oldest_first(store, Kind::Telemetry)
            }),
            secrets: rebuilt_if(any(Kind::Secret), &self.secrets, || secrets(store)),
            pod_labels,
            namespace_labels: rebuilt_if(any(Kind::Namespace), &self.namespace_labels, || {
                namespace_labels(store)
            }),
            mesh,
            networks,
            issues: self.issues.clone(),
        };
        // Route destinations are checked against hosts, subsets and gateways.
        if hosts_changed
            || any(Kind::VirtualService)
            || any(Kind::DestinationRule)
            || any(Kind::Gateway)
            || any(Kind::AuthorizationPolicy)
            || any(Kind::ConfigMap)
            || gateway_changed
        {
            ctx.issues = Arc::new(ctx.cross_check());
        }
        ctx
    }

    /// The Kubernetes services `changed` touched (by their Service, Endpoints or
    /// EndpointSlices, or a Pod behind them), as `previous` and this context hold them.
    pub fn touched_services_since<'a>(
        &'a self,
        previous: &'a PushContext,
        changed: &BTreeSet<ObjectKey>,
    ) -> Vec<ServiceChange<'a>> {
        touched_services(&previous.store, &self.store, changed)
            .into_iter()
            .map(|(ns, name)| {
                let host = kubernetes_hostname(&ns, &name);
                (previous.services.get(&host), self.services.get(&host))
            })
            .collect()
    }

    /// Cross-object checks: every route destination and subset must exist, every
    /// CUSTOM AuthorizationPolicy's provider, and the default tracing provider.
    pub(crate) fn cross_check(&self) -> Vec<ModelIssue> {
        let mut issues = self.networks.issues.clone();
        for ap in self.authorization_policies.iter() {
            let Spec::AuthorizationPolicy(spec) = &ap.spec else {
                continue;
            };
            let Some(name) = (spec.provider.as_ref()).map(|p| p.name.as_str()) else {
                continue;
            };
            let providers = &self.mesh.extension_providers;
            let problem = match providers
                .iter()
                .find(|p| p.name == name)
                .map(|p| p.authorizer())
            {
                None => format!(
                    "extension provider {name:?} is not defined in MeshConfig extensionProviders"
                ),
                Some(None) => format!(
                    "extension provider {name:?} is not envoyExtAuthzHttp or envoyExtAuthzGrpc"
                ),
                Some(Some((service, _))) if self.provider_host(service).is_none() => {
                    format!("extension provider {name:?}: no service {service:?}")
                }
                Some(Some(_)) => continue,
            };
            issues.push(ModelIssue {
                object: ap.key.to_string(),
                field: "spec.provider.name".into(),
                message: format!("{problem}; requests its rules match are denied"),
            });
        }
        if let Some(problem) = self.tracing_problem()
            && let Some((mesh, _)) = crate::mesh::MeshConfig::source(&self.store)
        {
            issues.push(ModelIssue {
                object: mesh.key.to_string(),
                field: "data.mesh.defaultProviders.tracing[0]".into(),
                message: format!("{}; no proxy is configured to trace", problem.message),
            });
        }
        // Delegates that are missing, not delegates, or not exported to their root.
        for vs in self.store.of_kind(Kind::VirtualService) {
            let Spec::VirtualService(spec) = &vs.spec else {
                continue;
            };
            if spec.hosts.is_empty() {
                continue; // a delegate: validation refuses one that delegates again
            }
            for (i, http) in spec.http.iter().enumerate() {
                let Some(target) = &http.delegate else {
                    continue;
                };
                let ns = crate::delegate::namespace_of(target, &vs.key.namespace);
                let key = ObjectKey::new(Kind::VirtualService, ns, &target.name);
                let found = self.store.get(&key);
                let default = &self.mesh.default_virtual_service_export_to;
                if let Some(message) = crate::delegate::unusable(
                    &vs.key.namespace,
                    target,
                    found.map(|f| &**f),
                    default,
                ) {
                    issues.push(ModelIssue {
                        object: vs.key.to_string(),
                        field: format!("spec.http[{i}].delegate"),
                        message,
                    });
                }
            }
        }
        for vs in self.virtual_services.iter() {
            let Spec::VirtualService(spec) = &vs.spec else {
                continue;
            };
            let http = spec.http.iter().enumerate().flat_map(|(i, http)| {
                (http.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.http[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            let tcp = spec.tcp.iter().enumerate().flat_map(|(i, tcp)| {
                (tcp.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.tcp[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            let mirrors = spec.http.iter().enumerate().flat_map(|(i, http)| {
                let mirror =
                    (http.mirror.iter()).map(move |d| (format!("spec.http[{i}].mirror"), d));
                let listed = (http.mirrors.iter().enumerate()).map(move |(j, m)| {
                    (
                        format!("spec.http[{i}].mirrors[{j}].destination"),
                        &m.destination,
                    )
                });
                mirror.chain(listed)
            });
            let tls = spec.tls.iter().enumerate().flat_map(|(i, tls)| {
                (tls.route.iter().enumerate()).map(move |(j, d)| {
                    (
                        format!("spec.tls[{i}].route[{j}].destination"),
                        &d.destination,
                    )
                })
            });
            {
                for (field, d) in http.chain(tcp).chain(tls).chain(mirrors) {
                    let host = resolve_host(&d.host, &vs.key.namespace);
                    if !self.services.contains_key(&host)
                        && !self.services.keys().any(|h| host_matches(h, &host))
                    {
                        let outcome = if field.contains(".mirror") {
                            "copies of requests go nowhere"
                        } else {
                            "requests get 503"
                        };
                        issues.push(ModelIssue {
                            object: vs.key.to_string(),
                            field: format!("{field}.host"),
                            message: format!("no service or ServiceEntry for host {host:?}; {outcome} until one exists"),
                        });
                    } else if let Some(subset) = &d.subset {
                        let defined = self.destination_rules.defines_subset(&host, subset);
                        if !defined {
                            issues.push(ModelIssue {
                                object: vs.key.to_string(),
                                field: format!("{field}.subset"),
                                message: format!("subset {subset:?} of {host:?} is not defined by any DestinationRule"),
                            });
                        }
                    }
                }
            }
            for (i, gw) in spec.gateways.iter().enumerate() {
                if gw != "mesh" && self.gateway(gw, &vs.key.namespace).is_none() {
                    issues.push(ModelIssue {
                        object: vs.key.to_string(),
                        field: format!("spec.gateways[{i}]"),
                        message: format!("gateway {gw:?} not found"),
                    });
                }
            }
        }
        issues
    }
}
