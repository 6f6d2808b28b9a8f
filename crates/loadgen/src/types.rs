//! The xDS type URLs a simulated proxy subscribes to.

pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str =
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const VIRTUAL_HOST_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";
/// Istio's DNS name table (NDS), which istio-agent asks for when DNS capture is on.
pub const NAME_TABLE_TYPE: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";
