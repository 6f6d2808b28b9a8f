//! Route configurations as sent, whole or as a VHDS shell with its virtual hosts apart.

use super::*;

pub(super) fn route_configuration(
    name: String,
    virtual_hosts: Vec<VirtualHost>,
) -> RouteConfiguration {
    RouteConfiguration {
        name,
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        max_direct_response_body_size_bytes: Some(UInt32Value { value: 1_048_576 }),
        ..Default::default()
    }
}

/// A route configuration whose virtual hosts are sent over VHDS
/// (`vhds_virtual_host`): no virtual hosts of its own, and VHDS over ADS. It stays the
/// same while its virtual hosts change, so Envoy keeps them (a changed route configuration
/// would drop them).
pub fn vhds_shell(name: String) -> RouteConfiguration {
    RouteConfiguration {
        vhds: vhds_over_ads(),
        ..route_configuration(name, Vec::new())
    }
}

pub(super) fn vhds_over_ads() -> Option<Vhds> {
    Some(Vhds {
        config_source: Some(crate::ads_config_source()),
    })
}

/// A route configuration split for VHDS: its shell ([`vhds_shell`]'s shape: every field
/// but the virtual hosts, and VHDS over ADS) and its virtual hosts as VHDS resources.
pub fn into_vhds(mut rc: RouteConfiguration) -> (RouteConfiguration, Vec<VirtualHost>) {
    let vhosts = std::mem::take(&mut rc.virtual_hosts);
    let vhosts = (vhosts.into_iter())
        .map(|vh| vhds_virtual_host(&rc.name, vh))
        .collect();
    rc.vhds = vhds_over_ads();
    (rc, vhosts)
}

/// A VHDS resource's name: `ROUTE_CONFIGURATION/VIRTUAL_HOST`, as Envoy's VHDS names them.
/// Envoy subscribes to a route configuration's name and takes every resource under it
/// (namespace matching), and removes a virtual host by the resource's name, so the virtual
/// host carries this name too (`vhds_virtual_host`).
pub fn vhds_name(route_config: &str, virtual_host: &str) -> String {
    format!("{route_config}/{virtual_host}")
}

/// A virtual host of `route_config` as sent over VHDS: named [`vhds_name`].
pub(super) fn vhds_virtual_host(route_config: &str, mut vh: VirtualHost) -> VirtualHost {
    vh.name = vhds_name(route_config, &vh.name);
    vh
}

/// An empty route configuration, for a name no listener defines (so listeners finish warming).
pub fn empty(name: &str) -> RouteConfiguration {
    route_configuration(name.to_string(), Vec::new())
}

/// A route configuration with the given virtual hosts (sidecar and gateway alike).
pub fn with_virtual_hosts(name: String, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    route_configuration(name, virtual_hosts)
}
