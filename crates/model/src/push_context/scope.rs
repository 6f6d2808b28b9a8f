//! What one proxy can see in a push context: its Sidecar, its services and
//! VirtualServices, its gateways, and whether a change concerns it.

use super::*;

impl PushContext {
    /// The Sidecar resource that applies to a proxy: one whose workloadSelector matches,
    /// else the namespace's selector-less one.
    pub fn sidecar_for(&self, proxy: &Proxy) -> Option<(&ConfigObject, &SidecarSpec)> {
        if proxy.kind != ProxyKind::Sidecar {
            return None;
        }
        let labels = self.proxy_labels(proxy);
        let in_ns = self
            .sidecars
            .iter()
            .filter(|s| s.key.namespace == proxy.namespace);
        let mut fallback = None;
        for sc in in_ns {
            let Spec::Sidecar(spec) = &sc.spec else {
                continue;
            };
            match &spec.workload_selector {
                Some(sel) if labels_match(&sel.labels, labels) => return Some((sc, spec)),
                Some(_) => {}
                None => fallback = fallback.or(Some((&**sc, spec))),
            }
        }
        fallback
    }

    /// Whether a config object in `namespace` with host `host` is in the Sidecar scope:
    /// imported by any of its egress listeners.
    pub(crate) fn in_scope(
        scope: Option<&SidecarSpec>,
        proxy_ns: &str,
        namespace: &str,
        host: &str,
    ) -> bool {
        let Some(scope) = scope else { return true };
        scope.egress.is_empty()
            || (scope.egress.iter()).any(|e| egress::imports(&e.hosts, proxy_ns, namespace, host))
    }

    /// The proxy's egress listeners ([`Egress::of`] its Sidecar).
    pub fn egress_listeners(&self, proxy: &Proxy) -> Vec<Egress<'_>> {
        Egress::of(self.sidecar_for(proxy).map(|(_, s)| s))
    }

    /// Services a sidecar may reach: exportTo, then its Sidecar's egress hosts; one per
    /// host.
    pub fn services_for(&self, proxy: &Proxy) -> Vec<&Arc<Service>> {
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported =
            |s: &Service| Self::in_scope(scope, &proxy.namespace, &s.namespace, &s.hostname);
        self.exported_services(&proxy.namespace, imported)
    }

    /// The services exported to `namespace` that `usable` accepts, one per host (sorted
    /// by host), but no alias (an ExternalName Service, served as the host it names): of a
    /// host several services declare, the one
    /// [`HostServices::choose`](crate::shared_hosts::HostServices::choose) picks.
    pub fn exported_services(
        &self,
        namespace: &str,
        usable: impl Fn(&Service) -> bool,
    ) -> Vec<&Arc<Service>> {
        let default = &self.mesh.default_service_export_to;
        (self.services.values())
            .filter(|s| s.alias_for.is_none())
            .filter_map(|s| match self.shared_hosts.get(&s.hostname) {
                Some(all) => all.choose(namespace, default, &usable),
                None => (s.visible_from(namespace, default) && usable(s)).then_some(s),
            })
            .collect()
    }

    /// The service of `host` the proxy gets: of a host several services declare, the one
    /// its Sidecar imports, else any exported to its namespace (as [`Self::services_for`]
    /// chooses), else the one most proxies get.
    pub fn service_for(&self, proxy: &Proxy, host: &str) -> Option<&Arc<Service>> {
        let Some(all) = self.shared_hosts.get(host) else {
            return self.services.get(host);
        };
        let default = &self.mesh.default_service_export_to;
        let ns = &proxy.namespace;
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported = |s: &Service| Self::in_scope(scope, ns, &s.namespace, &s.hostname);
        (all.choose(ns, default, imported))
            .or_else(|| all.choose(ns, default, |_| true))
            .or_else(|| self.services.get(host))
    }

    /// Every service: those most proxies get, then the others of shared hosts.
    pub fn all_services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values().chain(self.shared_hosts.others())
    }

    /// How many services there are (`pilot_services`).
    pub fn service_count(&self) -> usize {
        self.services.len() + self.shared_hosts.others().count()
    }

    /// VirtualServices bound to `gateway` (`mesh` or `NS/NAME`) visible to the proxy.
    pub fn virtual_services_for<'a>(
        &'a self,
        proxy: &Proxy,
        gateway: &str,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        let scope = self.sidecar_for(proxy).map(|(_, s)| s);
        let imported = |ns: &str, host: &str| Self::in_scope(scope, &proxy.namespace, ns, host);
        self.virtual_services_where(proxy, gateway, imported)
    }

    /// The `mesh`-bound VirtualServices one egress listener of the proxy imports.
    pub fn virtual_services_of<'a>(
        &'a self,
        proxy: &Proxy,
        egress: &Egress<'_>,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        let imported = |ns: &str, host: &str| egress.imports(&proxy.namespace, ns, host);
        self.virtual_services_where(proxy, "mesh", imported)
    }

    /// VirtualServices bound to `gateway`, exported to the proxy, with a host `imported`
    /// (namespace, host) allows.
    pub(crate) fn virtual_services_where<'a>(
        &'a self,
        proxy: &Proxy,
        gateway: &str,
        imported: impl Fn(&str, &str) -> bool,
    ) -> Vec<(&'a Arc<ConfigObject>, &'a VirtualServiceSpec)> {
        self.virtual_services
            .iter()
            .filter_map(|vs| match &vs.spec {
                Spec::VirtualService(spec) => Some((vs, spec)),
                _ => None,
            })
            .filter(|(vs, spec)| {
                let bound = if spec.gateways.is_empty() {
                    gateway == "mesh"
                } else {
                    spec.gateways.iter().any(|g| {
                        g == gateway
                            || (!g.contains('/') && format!("{}/{g}", vs.key.namespace) == gateway)
                    })
                };
                let visible = crate::exported_to(
                    &spec.export_to,
                    &self.mesh.default_virtual_service_export_to,
                    &vs.key.namespace,
                    &proxy.namespace,
                );
                bound
                    && visible
                    && (spec.hosts.iter())
                        .any(|h| imported(&vs.key.namespace, &resolve_host(h, &vs.key.namespace)))
            })
            .collect()
    }

    /// The port a gateway actually listens on for a Gateway server port: the targetPort of
    /// the gateway's own Service (one in its namespace selecting it) when that Service
    /// exposes the port, as istiod's resolvePorts does; else the port as written.
    pub fn gateway_listen_port(&self, proxy: &Proxy, port: u32) -> u32 {
        self.services_selecting(proxy)
            .filter(|s| {
                !s.labels
                    .contains_key("experimental.istio.io/disable-gateway-port-translation")
            })
            .find_map(|s| s.port(port))
            .map_or(port, |p| p.target_port.unwrap_or(port))
    }

    /// The services of the proxy's namespace it serves, by host: Kubernetes Services whose
    /// selector selects it, and ServiceEntries that have it (its address) as an endpoint.
    pub fn services_selecting<'a>(
        &'a self,
        proxy: &'a Proxy,
    ) -> impl Iterator<Item = &'a Arc<Service>> {
        let labels = self.proxy_labels(proxy);
        self.services.values().filter(move |s| {
            s.namespace == proxy.namespace
                && if s.kubernetes {
                    !s.selector.is_empty() && labels_match(&s.selector, labels)
                } else {
                    // A ServiceEntry: the proxy is one of its endpoints, by its address
                    // (istiod's `GetProxyServiceTargets` for its ServiceEntry registry).
                    s.alias_for.is_none()
                        && (s.endpoints.iter()).any(|e| proxy.ips.contains(&e.address))
                }
        })
    }

    /// Whether a change to any of `keys` can alter what `proxy` receives, judged on this
    /// (new) context. Conservative: a wrong `true` costs one diff, a wrong `false` would
    /// leave a proxy stale, so every kind translation reads must be covered here.
    pub fn affects<'a>(
        &self,
        proxy: &Proxy,
        keys: impl IntoIterator<Item = &'a ObjectKey>,
    ) -> bool {
        // The proxy's Sidecar, resolved once and only if a key needs it.
        let mut sidecar: Option<Option<&SidecarSpec>> = None;
        keys.into_iter().any(|key| match key.kind {
            // Inbound policy: the proxy's namespace, or mesh-wide from the root namespace.
            // Authorization guards gateways too; peer authentication only sidecars.
            Kind::PeerAuthentication | Kind::RequestAuthentication | Kind::AuthorizationPolicy => {
                (proxy.kind == ProxyKind::Sidecar || key.kind != Kind::PeerAuthentication)
                    && (key.namespace == proxy.namespace
                        || key.namespace == self.mesh.root_namespace())
            }
            // Telemetry: the proxy's namespace, or mesh-wide from the root namespace.
            Kind::Telemetry => {
                key.namespace == proxy.namespace || key.namespace == self.mesh.root_namespace()
            }
            // A Sidecar can only select proxies of its own namespace.
            Kind::Sidecar => key.namespace == proxy.namespace,
            // Sidecars read only `mesh`-bound routes; Gateways shape routers alone, and
            // only gateways read Secrets (credentialName).
            Kind::Gateway | Kind::Secret => proxy.kind == ProxyKind::Router,
            // Found by host from any namespace, or shaping endpoints everywhere: rare.
            Kind::DestinationRule | Kind::Namespace | Kind::Node | Kind::ConfigMap => true,
            Kind::Pod if key.namespace == proxy.namespace && key.name == proxy.pod_name => true,
            // A network's gateway is in every proxy's load assignments, once multi-network.
            Kind::Service if self.networks.names_service(&key.namespace, &key.name) => true,
            // A delegate shapes its roots, wherever they are.
            Kind::VirtualService
                if self
                    .delegated
                    .contains(&(key.namespace.clone(), key.name.clone())) =>
            {
                true
            }
            Kind::VirtualService
            | Kind::Service
            | Kind::EndpointSlice
            | Kind::Endpoints
            | Kind::ServiceEntry
            | Kind::WorkloadEntry
            | Kind::Pod => {
                let scope = *sidecar.get_or_insert_with(|| self.sidecar_for(proxy).map(|(_, s)| s));
                Self::namespace_in_scope(proxy, scope, &key.namespace)
            }
        })
    }

    /// Whether config from `namespace` can be in the egress scope of `proxy`, whose
    /// Sidecar is `scope`.
    pub(crate) fn namespace_in_scope(
        proxy: &Proxy,
        scope: Option<&SidecarSpec>,
        namespace: &str,
    ) -> bool {
        if proxy.kind == ProxyKind::Router {
            return true;
        }
        let Some(scope) = scope else {
            return true;
        };
        scope.egress.is_empty()
            || scope.egress.iter().flat_map(|e| &e.hosts).any(|h| {
                let ns = h.split_once('/').map_or("*", |(ns, _)| ns);
                ns == "*" || ns == namespace || (ns == "." && namespace == proxy.namespace)
            })
    }

    /// Whether traffic from this proxy to hosts outside the registry is refused: its
    /// Sidecar's `outboundTrafficPolicy` if it has one (whose unset mode is REGISTRY_ONLY,
    /// the zero value of Istio's enum, as istiod's SidecarScope reads it), else the mesh's.
    pub fn registry_only(&self, proxy: &Proxy) -> bool {
        let policy = self
            .sidecar_for(proxy)
            .and_then(|(_, s)| s.outbound_traffic_policy.as_ref());
        match policy {
            Some(policy) => policy.mode != Some(OutboundMode::AllowAny),
            None => self.mesh.registry_only(),
        }
    }

    /// The Sidecar's `egressProxy`: where the proxy's traffic to hosts outside the registry
    /// goes under ALLOW_ANY (validation allows it with ALLOW_ANY only).
    pub fn egress_proxy(&self, proxy: &Proxy) -> Option<&Destination> {
        if self.registry_only(proxy) {
            return None;
        }
        let (_, sidecar) = self.sidecar_for(proxy)?;
        sidecar
            .outbound_traffic_policy
            .as_ref()?
            .egress_proxy
            .as_ref()
    }

    /// Gateways whose selector matches a router proxy.
    pub fn gateways_for(&self, proxy: &Proxy) -> Vec<(&ConfigObject, &GatewaySpec)> {
        let labels = self.proxy_labels(proxy);
        self.gateways
            .iter()
            .filter_map(|g| match &g.spec {
                Spec::Gateway(spec) if labels_match(&spec.selector, labels) => Some((&**g, spec)),
                _ => None,
            })
            .collect()
    }
}
