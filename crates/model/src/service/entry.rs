//! The services of ServiceEntries: one per host, with the endpoints of their own
//! `endpoints`, the WorkloadEntries and the Pods their `workloadSelector` selects.

use super::*;

/// The services of every ServiceEntry, one per host.
pub(super) fn service_entries(store: &Store) -> Vec<Arc<Service>> {
    let workload_entries = ByLabel::new(store.of_kind(Kind::WorkloadEntry), workload_labels);
    let selecting = (store.of_kind(Kind::ServiceEntry))
        .any(|o| matches!(&o.spec, Spec::ServiceEntry(se, _) if se.workload_selector.is_some()));
    let pods = match selecting {
        true => ByLabel::new(store.of_kind(Kind::Pod), |o| &o.meta.labels),
        false => ByLabel::default(),
    };
    let mut out = Vec::new();
    for obj in store.of_kind(Kind::ServiceEntry) {
        let Spec::ServiceEntry(se, allocated) = &obj.spec else {
            continue;
        };
        let namespace = store.namespace_annotations(&obj.key.namespace);
        let mut services = service_entry_services(obj, se, allocated, &workload_entries, namespace);
        if let Some(selector) = &se.workload_selector {
            let pods = selected_pods(store, &pods, &obj.key.namespace, &selector.labels, se);
            if !pods.is_empty() {
                for svc in &mut services {
                    svc.endpoints.extend(pods.iter().cloned());
                    svc.endpoints.sort_by(|a, b| a.address.cmp(&b.address));
                }
            }
        }
        out.extend(services.into_iter().map(Arc::new));
    }
    out
}

/// A WorkloadEntry's labels (none for anything else).
pub(super) fn workload_labels(o: &ConfigObject) -> &BTreeMap<String, String> {
    static NONE: BTreeMap<String, String> = BTreeMap::new();
    match &o.spec {
        Spec::WorkloadEntry(w) => &w.labels,
        _ => &NONE,
    }
}

/// The Pods of `namespace` a ServiceEntry's `workloadSelector` selects, as its endpoints:
/// istiod's ServiceEntry controller takes Pods as workload instances as it takes
/// WorkloadEntries. A Pod without an IP yet is none.
pub(super) fn selected_pods(
    store: &Store,
    pods: &ByLabel<'_>,
    namespace: &str,
    selector: &BTreeMap<String, String>,
    se: &ServiceEntrySpec,
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for pod in pods.selected(namespace, selector, |o| &o.meta.labels) {
        let Spec::Pod(def) = &pod.spec else { continue };
        let Some(ip) = def.ip.as_ref().filter(|ip| !ip.is_empty()) else {
            continue;
        };
        let node = (def.node_name.as_deref())
            .and_then(|n| store.get(&ObjectKey::new(Kind::Node, "", n)))
            .map(|n| &n.meta.labels);
        out.push(Endpoint {
            address: ip.clone(),
            ports: (se.ports.iter())
                .map(|p| (p.number, p.target_port.unwrap_or(p.number)))
                .collect(),
            labels: pod.meta.labels.clone(),
            locality: endpoint_locality(&pod.meta.labels, node, None),
            network: String::new(),
            weight: 1,
            healthy: true,
            service_account: def.service_account.clone(),
            pod: Some(pod.key.name.clone()),
            hostname: None,
            workload: def.workload.clone(),
        });
    }
    out
}

/// The endpoint of WorkloadEntry `we` (of workload `workload`) for a ServiceEntry's
/// `ports`.
pub(super) fn workload_endpoint(
    we: &WorkloadEntrySpec,
    workload: String,
    ports: &[ServicePort],
    se_ports: &[api::networking::Port],
) -> Endpoint {
    let mut map = BTreeMap::new();
    for (p, sp) in ports.iter().zip(se_ports) {
        let target = we
            .ports
            .get(&p.name)
            .copied()
            .or(sp.target_port)
            .unwrap_or(p.port);
        map.insert(p.port, target);
    }
    Endpoint {
        address: we.address.clone(),
        ports: map,
        labels: we.labels.clone(),
        // Its own `network` only, as istiod's endpoint has it (no fallback: an entry
        // without one is reachable from every network).
        network: we.network.clone().unwrap_or_default(),
        locality: we
            .locality
            .as_deref()
            .map(Locality::parse)
            .unwrap_or_default(),
        weight: we.weight.filter(|w| *w > 0).unwrap_or(1),
        healthy: true,
        service_account: we.service_account.clone(),
        pod: None,
        hostname: None,
        workload,
    }
}

/// A ServiceEntry address as istiod keeps it: a CIDR of one address (`/32`, `/128`) is that
/// address, so it gets a listener of its own.
pub(super) fn host_address(address: &str) -> String {
    match address.split_once('/') {
        Some((ip, len)) => match (ip.parse::<std::net::IpAddr>(), len.parse::<u8>()) {
            (Ok(std::net::IpAddr::V4(_)), Ok(32)) | (Ok(std::net::IpAddr::V6(_)), Ok(128)) => {
                ip.to_string()
            }
            _ => address.to_string(),
        },
        None => address.to_string(),
    }
}

/// The label by which a ServiceEntry opts out of IP auto-allocation.
pub const AUTOALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";

/// Whether a ServiceEntry gets auto-allocated addresses, and uses those its status holds
/// (istiod's `ShouldV2AutoAllocateIP`, the feature switch aside): it has no addresses of
/// its own, its resolution is not `NONE` (the proxy could not tell where a connection to
/// such an address was meant to go), and it did not opt out by label.
pub fn auto_allocates(se: &ServiceEntrySpec, labels: &BTreeMap<String, String>) -> bool {
    se.addresses.is_empty()
        && se.resolution.is_some_and(|r| r != Resolution::None)
        && !(labels.get(AUTOALLOCATE_LABEL)).is_some_and(|v| v.eq_ignore_ascii_case("false"))
}

/// The hosts of a ServiceEntry that get an address (istiod's `keepHost`): each once, and
/// a wildcard never (meshd has no `DYNAMIC_DNS` resolution, the only one that keeps one).
pub fn allocatable_hosts(se: &ServiceEntrySpec) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for h in se.hosts.iter().filter(|h| !h.starts_with('*')) {
        if !out.contains(&h.as_str()) {
            out.push(h);
        }
    }
    out
}

pub(super) fn service_entry_services(
    obj: &ConfigObject,
    se: &ServiceEntrySpec,
    allocated: &[AllocatedAddress],
    workload_entries: &ByLabel<'_>,
    namespace_annotations: Option<&BTreeMap<String, String>>,
) -> Vec<Service> {
    let ports: Vec<ServicePort> = se
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.number,
            protocol: Protocol::parse(if p.protocol.is_empty() {
                &p.name
            } else {
                &p.protocol
            }),
            target_port: p.target_port,
        })
        .collect();
    // Inline endpoints are workloads `NAME-INDEX` of the entry, as istiod names them.
    let mut endpoints: Vec<Endpoint> = (se.endpoints.iter().enumerate())
        .filter(|(_, e)| !e.address.is_empty())
        .map(|(i, e)| {
            let workload = format!("{}-{i}", obj.key.name);
            workload_endpoint(e, workload, &ports, &se.ports)
        })
        .collect();
    if let Some(sel) = &se.workload_selector {
        for we in workload_entries.selected(&obj.key.namespace, &sel.labels, workload_labels) {
            if let Spec::WorkloadEntry(w) = &we.spec
                && !w.address.is_empty()
            {
                let (meta, name) = (&we.meta, we.key.name.as_str());
                let workload = crate::config::workload::workload_entry_workload(
                    name,
                    &meta.annotations,
                    &meta.labels,
                );
                endpoints.push(workload_endpoint(w, workload.into(), &ports, &se.ports));
            }
        }
    }
    let discovery = match se.resolution.unwrap_or(Resolution::None) {
        Resolution::Static => Discovery::Eds,
        Resolution::Dns => Discovery::StrictDns,
        Resolution::DnsRoundRobin => Discovery::LogicalDns,
        Resolution::None => Discovery::Passthrough,
    };
    if matches!(discovery, Discovery::StrictDns | Discovery::LogicalDns) && endpoints.is_empty() {
        for host in se.hosts.iter().filter(|h| !h.starts_with('*')) {
            endpoints.push(Endpoint {
                address: host.clone(),
                ports: ports.iter().map(|p| (p.port, p.port)).collect(),
                labels: BTreeMap::new(),
                locality: Locality::default(),
                network: String::new(),
                weight: 1,
                healthy: true,
                service_account: None,
                pod: None,
                hostname: None,
                workload: obj.key.name.clone(),
            });
        }
    }
    let addresses: Vec<String> = se.addresses.iter().map(|a| host_address(a)).collect();
    let auto = auto_allocates(se, &obj.meta.labels);
    // Of several addresses of one family for a host, the last, as istiod keeps.
    let auto_allocated = |host: &str| {
        let mut out = AutoAllocated::default();
        for a in allocated.iter().filter(|a| auto && a.host == host) {
            let slot = if a.ip.is_ipv4() {
                &mut out.ipv4
            } else {
                &mut out.ipv6
            };
            *slot = Some(a.ip.to_string());
        }
        out
    };
    let last = se.hosts.len().saturating_sub(1);
    se.hosts
        .iter()
        .enumerate()
        .map(|(i, host)| Service {
            hostname: host.clone(),
            namespace: obj.key.namespace.clone(),
            name: obj.key.name.clone(),
            kubernetes: false,
            vip: addresses.first().cloned(),
            more_addresses: addresses.iter().skip(1).cloned().collect(),
            auto_allocated: auto_allocated(host),
            ports: ports.clone(),
            endpoints: if matches!(discovery, Discovery::StrictDns | Discovery::LogicalDns) {
                endpoints
                    .iter()
                    .filter(|e| !se.endpoints.is_empty() || &e.address == host)
                    .cloned()
                    .collect()
            } else if i == last {
                std::mem::take(&mut endpoints)
            } else {
                endpoints.clone()
            },
            discovery,
            mesh_external: se.location != Some(Location::MeshInternal),
            export_to: se.export_to.clone(),
            creation: obj.meta.creation_timestamp.clone(),
            selector: BTreeMap::new(),
            labels: obj.meta.labels.clone(),
            traffic_distribution: TrafficDistribution::of(
                None,
                &obj.meta.annotations,
                namespace_annotations,
            ),
            alias_for: None,
            aliases: Vec::new(),
        })
        .collect()
}
