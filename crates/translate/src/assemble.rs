//! The one assembler of what a proxy is sent: [`assemble`] walks a proxy's [`Plan`] and
//! hands each part to an [`Assembly`]. [`ProxyConfig`] builds every part; the xDS layer's
//! cache is the other assembly, which takes each per-service part (a service's clusters
//! and load assignments, a default or shared virtual host, a gateway's virtual host, a
//! name-table entry) encoded from a memo of the same builders. What a proxy gets, and in
//! which order, is decided here once.

use std::sync::Arc;

use envoy_api::pb::envoy::config::cluster::v3::Cluster;
use envoy_api::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_api::pb::envoy::config::listener::v3::Listener;
use envoy_api::pb::envoy::config::route::v3::VirtualHost;
use envoy_api::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use model::config::ConfigObject;
use model::{Proxy, PushContext, Service};

use crate::route::{self, GatewayVirtualHost, RouteHeaders, VirtualHostPlan};
use crate::{ProxyConfig, cluster, cluster_plan, locality, name_table, plan};

/// Where [`assemble`] puts a proxy's configuration, part by part.
pub trait Assembly {
    /// A virtual host as this assembly keeps it until its route configuration is complete.
    type VirtualHost;

    /// The clusters and load assignments of each of `services` ([`cluster::service`]),
    /// then the plan's own `clusters` and `endpoints`.
    fn clusters(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        services: &[&Arc<Service>],
        clusters: Vec<Cluster>,
        endpoints: Vec<ClusterLoadAssignment>,
    );
    fn listeners(&mut self, listeners: Vec<Listener>);
    fn secrets(&mut self, secrets: Vec<Secret>);
    /// A service's virtual host without a VirtualService ([`route::default_virtual_host`]).
    fn default_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> Self::VirtualHost;
    /// A service's virtual host from a VirtualService whose routes do not depend on the
    /// proxy ([`route::routed_virtual_host`]).
    fn shared_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vs: &Arc<ConfigObject>,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> Self::VirtualHost;
    /// A gateway's virtual host: its head, each bound VirtualService's routes, its tail.
    fn gateway_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vh: &GatewayVirtualHost,
    ) -> Self::VirtualHost;
    /// A virtual host built for this proxy alone.
    fn virtual_host(&mut self, vh: &VirtualHost) -> Self::VirtualHost;
    /// The route configuration `name`, holding `virtual_hosts` in order (over VHDS for a
    /// proxy on [`Proxy::vhds`]: its shell, and each virtual host as a resource), each
    /// with what the proxy's `headers` change in it.
    fn route_configuration(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        name: &str,
        virtual_hosts: Vec<Self::VirtualHost>,
        headers: Option<RouteHeaders>,
    );
    /// The DNS name table of `services`, for a proxy whose agent runs a DNS proxy.
    fn name_table(&mut self, ctx: &PushContext, proxy: &Proxy, services: &[&Arc<Service>]);
}

/// Assembles everything `proxy` is sent into `out`.
pub fn assemble<A: Assembly>(ctx: &PushContext, proxy: &Proxy, out: &mut A) {
    let plan = plan(ctx, proxy);
    out.clusters(ctx, proxy, &plan.services, plan.clusters, plan.endpoints);
    out.listeners(plan.listeners);
    out.secrets(plan.secrets);
    for r in plan.sidecar_routes {
        let (port, sniffed) = (r.port, r.sniffed);
        let mut vhosts: Vec<A::VirtualHost> = (r.vhosts.into_iter())
            .map(|v| match v {
                VirtualHostPlan::Default(svc) => {
                    out.default_virtual_host(ctx, proxy, svc, port, sniffed)
                }
                VirtualHostPlan::Shared { vs, service } => {
                    out.shared_virtual_host(ctx, proxy, vs, service, port, sniffed)
                }
                VirtualHostPlan::Routed(vh) => out.virtual_host(&vh),
            })
            .collect();
        // A sniffed listener's route configuration has its one virtual host only.
        if !sniffed {
            vhosts.extend(plan.catch_all.as_ref().map(|c| out.virtual_host(c)));
        }
        out.route_configuration(ctx, proxy, &r.name, vhosts, plan.route_headers);
    }
    for r in &plan.gateway_routes {
        let planned = route::gateway_plan(ctx, proxy, &r.servers);
        let vhosts = if planned.is_empty() {
            vec![out.virtual_host(&route::gateway_blackhole(r.listen_port))]
        } else {
            (planned.iter())
                .map(|vh| out.gateway_virtual_host(ctx, proxy, vh))
                .collect()
        };
        out.route_configuration(ctx, proxy, &r.name, vhosts, plan.route_headers);
    }
    if proxy.dns_proxy {
        out.name_table(ctx, proxy, &plan.services);
    }
}

/// Translates the push context for one proxy, every part built.
pub fn proxy_config(ctx: &PushContext, proxy: &Proxy) -> ProxyConfig {
    let mut config = ProxyConfig::default();
    assemble(ctx, proxy, &mut config);
    config
}

/// The part of [`assemble`] that a push changing endpoints only alters
/// ([`cluster_plan`]): the clusters and load assignments, and the name table when it
/// reads endpoints (a headless service's entry is its endpoints). Returns whether the
/// name table was assembled; the rest of the proxy's configuration is as before.
pub fn assemble_clusters<A: Assembly>(ctx: &PushContext, proxy: &Proxy, out: &mut A) -> bool {
    let plan = cluster_plan(ctx, proxy);
    out.clusters(ctx, proxy, &plan.services, plan.clusters, plan.endpoints);
    let table = proxy.dns_proxy && name_table::reads_endpoints(&plan.services);
    if table {
        out.name_table(ctx, proxy, &plan.services);
    }
    table
}

impl Assembly for ProxyConfig {
    type VirtualHost = VirtualHost;

    fn clusters(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        services: &[&Arc<Service>],
        clusters: Vec<Cluster>,
        endpoints: Vec<ClusterLoadAssignment>,
    ) {
        let secure = proxy.identity.is_some();
        let at = locality::place(ctx, proxy);
        for svc in services {
            let rule = ctx.service_rule(proxy, svc);
            let (mut c, e) =
                cluster::service(ctx, svc, rule.map(|r| &**r), proxy.kind, secure, &at);
            if proxy.istio_extensions {
                crate::istio_proxy::add_cluster_filters(ctx, &mut c);
            }
            self.clusters.extend(c);
            self.endpoints.extend(e);
        }
        self.clusters.extend(clusters);
        self.endpoints.extend(endpoints);
    }

    fn listeners(&mut self, listeners: Vec<Listener>) {
        self.listeners.extend(listeners);
    }

    fn secrets(&mut self, secrets: Vec<Secret>) {
        self.secrets.extend(secrets);
    }

    fn default_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> VirtualHost {
        VirtualHostPlan::Default(svc).build(ctx, proxy, port, sniffed)
    }

    fn shared_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vs: &Arc<ConfigObject>,
        svc: &Arc<Service>,
        port: u32,
        sniffed: bool,
    ) -> VirtualHost {
        let plan = VirtualHostPlan::Shared { vs, service: svc };
        plan.build(ctx, proxy, port, sniffed)
    }

    fn gateway_virtual_host(
        &mut self,
        ctx: &PushContext,
        proxy: &Proxy,
        vh: &GatewayVirtualHost,
    ) -> VirtualHost {
        vh.build(ctx, proxy)
    }

    fn virtual_host(&mut self, vh: &VirtualHost) -> VirtualHost {
        vh.clone()
    }

    fn route_configuration(
        &mut self,
        _: &PushContext,
        proxy: &Proxy,
        name: &str,
        mut virtual_hosts: Vec<VirtualHost>,
        headers: Option<RouteHeaders>,
    ) {
        if let Some(headers) = headers {
            virtual_hosts.iter_mut().for_each(|vh| headers.apply(vh));
        }
        let rc = route::with_virtual_hosts(name.to_string(), virtual_hosts);
        if proxy.vhds {
            let (shell, vhosts) = route::into_vhds(rc);
            self.routes.push(shell);
            self.virtual_hosts.extend(vhosts);
        } else {
            self.routes.push(rc);
        }
    }

    fn name_table(&mut self, _: &PushContext, proxy: &Proxy, services: &[&Arc<Service>]) {
        self.name_table = Some(name_table::name_table(proxy, services));
    }
}
