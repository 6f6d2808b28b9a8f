//! `meshd proxy-status` and `meshd proxy-config`, in istioctl's habit: they read a running
//! instance's debug endpoints (`/debug/syncz`, `/debug/config_dump`) and print tables, or
//! the JSON with `-o json`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use xds::debug::proxy_matches;
use xds::origin::parse_config_path;

/// Left-aligned columns separated by at least two spaces, as istioctl prints them.
pub fn table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let mut widths = vec![0usize; columns];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let row = row.as_ref();
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The largest debug view read (a 10,000-service mesh's `config_dump` is tens of MB).
const MAX_BODY: u64 = 512 << 20;

/// One GET against the monitoring port; the body of a 200, or the error it carried.
pub fn http_get(address: &str, path: &str) -> anyhow::Result<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(30)))
        .http_status_as_error(false)
        .build()
        .into();
    let mut response = agent
        .get(format!("http://{address}{path}"))
        .call()
        .map_err(|e| anyhow::anyhow!("cannot reach meshd's monitoring port at {address}: {e}"))?;
    let status = response.status();
    let body = (response.body_mut().with_config().limit(MAX_BODY))
        .read_to_string()
        .map_err(|e| anyhow::anyhow!("reading {path}: {e}"))?;
    if status != 200 {
        anyhow::bail!("{path}: HTTP {}: {}", status.as_u16(), body.trim());
    }
    Ok(body)
}

fn get_json(address: &str, path: &str) -> anyhow::Result<Value> {
    let body = http_get(address, path)?;
    serde_json::from_str(&body).map_err(|e| anyhow::anyhow!("{path}: {e}"))
}

/// `NAME` as istioctl shows it: `POD.NAMESPACE` from the node id.
fn short_name(node: &str) -> String {
    node.split('~').nth(2).unwrap_or(node).to_string()
}

/// Per type, as istioctl shows it from istiod's CSDS status: ERROR (the last response
/// was rejected), NOT SENT, SYNCED (the last response was ACKed), STALE (sent, not ACKed
/// yet).
fn type_state(types: &Value, short: &str) -> String {
    let t = &types[short];
    let sent = t["nonce_sent"].as_str().unwrap_or("");
    let acked = t["nonce_acked"].as_str().unwrap_or("");
    if t["rejected"].as_bool() == Some(true) {
        "ERROR".into()
    } else if sent.is_empty() {
        "NOT SENT".into()
    } else if sent == acked {
        "SYNCED".into()
    } else {
        "STALE".into()
    }
}

/// `meshd proxy-status`: every connected proxy (or only `proxy`) and how far each type
/// is in sync.
pub fn proxy_status(address: &str, proxy: Option<&str>, json: bool) -> anyhow::Result<String> {
    let mut syncz = get_json(address, "/debug/syncz")?;
    let status = get_json(address, "/debug/push_status")?;
    if let (Some(id), Some(all)) = (proxy, syncz.as_array_mut()) {
        all.retain(|p| {
            p["proxy"]
                .as_str()
                .is_some_and(|node| proxy_matches(node, id))
        });
        if all.is_empty() {
            anyhow::bail!("no connected proxy {id:?}");
        }
    }
    if json {
        return Ok(format!("{syncz:#}\n"));
    }
    let revision = status["revision"].as_str().unwrap_or("default");
    Ok(status_table(&syncz, revision))
}

/// `/debug/syncz` as istioctl's proxy-status table, one row per proxy by name. A VHDS
/// column follows RDS when some proxy gets its virtual hosts over VHDS
/// (`MESHD_ENABLE_VHDS`); without, the columns are istioctl's.
fn status_table(syncz: &Value, revision: &str) -> String {
    let mut proxies: Vec<&Value> = syncz.as_array().into_iter().flatten().collect();
    proxies.sort_by_key(|p| p["proxy"].as_str().unwrap_or("").to_string());
    let vhds = proxies.iter().any(|p| !p["types"]["vhds"].is_null());
    let types: Vec<&str> = ["cds", "lds", "eds", "rds", "vhds", "sds"]
        .into_iter()
        .filter(|t| vhds || *t != "vhds")
        .collect();
    let mut header = vec!["NAME".to_string(), "CLUSTER".into()];
    header.extend(types.iter().map(|t| t.to_ascii_uppercase()));
    header.extend(["REVISION".into(), "VERSION".into()]);
    let mut rows = vec![header];
    for p in proxies {
        let mut row = vec![
            short_name(p["proxy"].as_str().unwrap_or("")),
            p["cluster_id"].as_str().unwrap_or("").to_string(),
        ];
        row.extend(types.iter().map(|t| type_state(&p["types"], t)));
        row.push(revision.to_string());
        row.push(p["istio_version"].as_str().unwrap_or("").to_string());
        rows.push(row);
    }
    table(&rows)
}

/// The resources of one kind a config dump holds (meshd's `/debug/config_dump` or
/// Envoy's own `/config_dump`): those of `section` (such as `dynamic_active_clusters`),
/// each the value at `field` inside its entry, by name.
pub fn dump_by_name(dump: &Value, section: &str, field: &[&str]) -> BTreeMap<String, Value> {
    dump_section(dump, section)
        .filter_map(|entry| {
            let r = field.iter().fold(entry, |v, f| &v[*f]);
            Some((r["name"].as_str()?.to_string(), r.clone()))
        })
        .collect()
}

/// The entries of one section of a config dump, such as `dynamic_active_clusters`.
fn dump_section<'a>(dump: &'a Value, section: &str) -> impl Iterator<Item = &'a Value> {
    (dump["configs"].as_array().into_iter().flatten())
        .filter_map(move |c| c.get(section)?.as_array())
        .flatten()
}

/// `meshd proxy-status PROXY --envoy-admin ADDR`: the proxy's clusters, listeners and
/// routes as meshd serves them, against what its Envoy holds (`/config_dump` of its
/// admin port), resource by resource, as `istioctl proxy-status POD` reports it:
/// `Clusters Match`, or `Clusters Don't Match` and what differs.
pub fn compare_with_envoy(address: &str, proxy: &str, envoy_admin: &str) -> anyhow::Result<String> {
    let ours = get_json(
        address,
        &format!("/debug/config_dump?proxyID={}", query_escape(proxy)),
    )?;
    let theirs = get_json(envoy_admin, "/config_dump")?;
    let mut out = String::new();
    for (title, section, field) in [
        ("Clusters", "dynamic_active_clusters", &["cluster"][..]),
        (
            "Listeners",
            "dynamic_listeners",
            &["active_state", "listener"][..],
        ),
        ("Routes", "dynamic_route_configs", &["route_config"][..]),
    ] {
        let diff = resources_diff(
            &dump_by_name(&ours, section, field),
            &dump_by_name(&theirs, section, field),
        );
        // As istioctl: when Envoy last took a route configuration.
        let loaded = (title == "Routes")
            .then(|| {
                let times =
                    dump_section(&theirs, section).filter_map(|r| r["last_updated"].as_str());
                times.max()
            })
            .flatten()
            .map(|at| format!(" (RDS last loaded at {at})"))
            .unwrap_or_default();
        if diff.is_empty() {
            out.push_str(&format!("{title} Match{loaded}\n"));
        } else {
            out.push_str(&format!("{title} Don't Match{loaded}\n{diff}"));
        }
    }
    Ok(out)
}

/// What differs between meshd's resources and Envoy's, one line each: a name only one
/// side has, and for a resource both have, each field whose values differ.
fn resources_diff(ours: &BTreeMap<String, Value>, theirs: &BTreeMap<String, Value>) -> String {
    let mut out = String::new();
    for name in ours.keys().chain(theirs.keys()).collect::<BTreeSet<_>>() {
        match (ours.get(name), theirs.get(name)) {
            (Some(_), None) => {
                out.push_str(&format!("  - {name}: served by meshd, not held by Envoy\n"))
            }
            (None, Some(_)) => {
                out.push_str(&format!("  + {name}: held by Envoy, not served by meshd\n"))
            }
            (Some(a), Some(b)) => {
                let mut fields = Vec::new();
                json_diff(a, b, String::new(), &mut fields);
                for (path, a, b) in fields {
                    out.push_str(&format!("  ~ {name} {path}: meshd {a}, Envoy {b}\n"));
                }
            }
            (None, None) => {}
        }
    }
    out
}

/// The paths (`/a/b/0`) where two JSON values differ, with each side's value there.
fn json_diff(a: &Value, b: &Value, path: String, out: &mut Vec<(String, String, String)>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for key in x.keys().chain(y.keys()).collect::<BTreeSet<_>>() {
                let missing = Value::Null;
                let (va, vb) = (
                    x.get(key).unwrap_or(&missing),
                    y.get(key).unwrap_or(&missing),
                );
                json_diff(va, vb, format!("{path}/{key}"), out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                json_diff(va, vb, format!("{path}/{i}"), out);
            }
        }
        _ if a != b => out.push((
            if path.is_empty() { "/".into() } else { path },
            a.to_string(),
            b.to_string(),
        )),
        _ => {}
    }
}

/// What `meshd proxy-config` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigKind {
    Cluster,
    Listener,
    Route,
    Endpoint,
    Secret,
}

/// `meshd proxy-config KIND PROXY`: one part of a proxy's configuration, as meshd serves
/// it now, read from `/debug/config_dump`.
pub fn proxy_config(
    address: &str,
    kind: ConfigKind,
    proxy: &str,
    json: bool,
) -> anyhow::Result<String> {
    let dump = get_json(
        address,
        &format!("/debug/config_dump?proxyID={}", query_escape(proxy)),
    )?;
    let section = |ty: &str| -> Value {
        dump["configs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(ty)))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (part, items) = match kind {
        ConfigKind::Cluster => (section("ClustersConfigDump"), "dynamic_active_clusters"),
        ConfigKind::Listener => (section("ListenersConfigDump"), "dynamic_listeners"),
        ConfigKind::Route => (section("RoutesConfigDump"), "dynamic_route_configs"),
        ConfigKind::Endpoint => (section("EndpointsConfigDump"), "dynamic_endpoint_configs"),
        ConfigKind::Secret => (section("SecretsConfigDump"), "dynamic_active_secrets"),
    };
    let items: Vec<Value> = part[items].as_array().cloned().unwrap_or_default();
    if json {
        let inner: Vec<&Value> = items
            .iter()
            .map(|i| match kind {
                ConfigKind::Cluster => &i["cluster"],
                ConfigKind::Listener => &i["active_state"]["listener"],
                ConfigKind::Route => &i["route_config"],
                ConfigKind::Endpoint => &i["endpoint_config"],
                ConfigKind::Secret => &i["secret"],
            })
            .collect();
        return Ok(format!(
            "{:#}\n",
            Value::from(inner.into_iter().cloned().collect::<Vec<_>>())
        ));
    }
    Ok(match kind {
        ConfigKind::Cluster => clusters_table(&items),
        ConfigKind::Listener => listeners_table(&items),
        ConfigKind::Route => routes_table(&items),
        ConfigKind::Endpoint => endpoints_table(&items),
        ConfigKind::Secret => secrets_table(&items),
    })
}

fn query_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// `name.namespace` of the object behind `metadata.filter_metadata.istio.config`.
fn config_name(metadata: &Value) -> String {
    metadata["filter_metadata"]["istio"]["config"]
        .as_str()
        .and_then(parse_config_path)
        .map(|k| format!("{}.{}", k.name, k.namespace))
        .unwrap_or_else(|| "-".into())
}

fn clusters_table(items: &[Value]) -> String {
    let mut rows = vec![[
        "SERVICE FQDN".to_string(),
        "PORT".into(),
        "SUBSET".into(),
        "DIRECTION".into(),
        "TYPE".into(),
        "DESTINATION RULE".into(),
    ]];
    for item in items {
        let c = &item["cluster"];
        let name = text(&c["name"]);
        let parts: Vec<&str> = name.split('|').collect();
        let (fqdn, port, subset, direction) = match parts[..] {
            [direction, port, subset, fqdn] => (
                fqdn.to_string(),
                port.to_string(),
                subset.to_string(),
                direction.to_string(),
            ),
            _ => (name.clone(), "-".into(), "-".into(), "-".into()),
        };
        let ty = match &c["type"] {
            Value::Null if c["cluster_type"].is_object() => text(&c["cluster_type"]["name"]),
            Value::Null => "STATIC".into(),
            t => text(t),
        };
        rows.push([
            fqdn,
            port,
            if subset.is_empty() {
                "-".into()
            } else {
                subset
            },
            direction,
            ty,
            config_name(&c["metadata"]),
        ]);
    }
    table(&rows)
}

fn listeners_table(items: &[Value]) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "ADDRESSES".into(),
        "PORT".into(),
        "MATCH".into(),
        "DESTINATION".into(),
    ]];
    for item in items {
        let l = &item["active_state"]["listener"];
        let socket = &l["address"]["socket_address"];
        let chains: Vec<&Value> = l["filter_chains"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(l.get("default_filter_chain"))
            .collect();
        for chain in chains {
            rows.push([
                text(&l["name"]),
                text(&socket["address"]),
                text(&socket["port_value"]),
                chain_match(&chain["filter_chain_match"]),
                chain_destination(chain),
            ]);
        }
    }
    table(&rows)
}

fn chain_match(m: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(p) = m.get("destination_port") {
        parts.push(format!("port {}", text(p)));
    }
    if let Some(t) = m.get("transport_protocol") {
        parts.push(format!("transport {}", text(t)));
    }
    if let Some(names) = m["server_names"].as_array() {
        parts.push(format!(
            "SNI {}",
            names.iter().map(text).collect::<Vec<_>>().join(",")
        ));
    }
    if let Some(alpn) = m["application_protocols"].as_array() {
        parts.push(format!(
            "ALPN {}",
            alpn.iter().map(text).collect::<Vec<_>>().join(",")
        ));
    }
    if parts.is_empty() {
        "ALL".into()
    } else {
        parts.join("; ")
    }
}

fn chain_destination(chain: &Value) -> String {
    for filter in chain["filters"].as_array().into_iter().flatten() {
        let cfg = &filter["typed_config"];
        if let Some(route) = cfg["rds"]["route_config_name"].as_str() {
            return format!("Route: {route}");
        }
        if cfg["route_config"].is_object() {
            return "Inline Route".into();
        }
        if let Some(cluster) = cfg["cluster"].as_str() {
            return format!("Cluster: {cluster}");
        }
    }
    "-".into()
}

fn routes_table(items: &[Value]) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "VHOST NAME".into(),
        "DOMAINS".into(),
        "MATCH".into(),
        "VIRTUAL SERVICE".into(),
    ]];
    for item in items {
        let rc = &item["route_config"];
        for vh in rc["virtual_hosts"].as_array().into_iter().flatten() {
            let domains: Vec<String> = vh["domains"]
                .as_array()
                .into_iter()
                .flatten()
                .map(text)
                .collect();
            let shown = match domains.len() {
                0 => "-".to_string(),
                1 => domains[0].clone(),
                n => format!("{} + {} more...", domains[0], n - 1),
            };
            for route in vh["routes"].as_array().into_iter().flatten() {
                let m = &route["match"];
                let matched = if let Some(p) = m.get("prefix") {
                    format!("{}*", text(p))
                } else if let Some(p) = m.get("path").or(m.get("path_separated_prefix")) {
                    text(p)
                } else if let Some(r) = m["safe_regex"]["regex"].as_str() {
                    format!("~{r}")
                } else {
                    "-".into()
                };
                rows.push([
                    text(&rc["name"]),
                    text(&vh["name"]),
                    shown.clone(),
                    matched,
                    config_name(&route["metadata"]),
                ]);
            }
        }
    }
    table(&rows)
}

fn endpoints_table(items: &[Value]) -> String {
    let mut rows = vec![[
        "ENDPOINT".to_string(),
        "STATUS".into(),
        "OUTLIER CHECK".into(),
        "CLUSTER".into(),
    ]];
    for item in items {
        let cla = &item["endpoint_config"];
        for group in cla["endpoints"].as_array().into_iter().flatten() {
            for lb in group["lb_endpoints"].as_array().into_iter().flatten() {
                let socket = &lb["endpoint"]["address"]["socket_address"];
                let status = match &lb["health_status"] {
                    Value::Null => "HEALTHY".to_string(),
                    s => text(s),
                };
                rows.push([
                    format!(
                        "{}:{}",
                        text(&socket["address"]),
                        text(&socket["port_value"])
                    ),
                    status,
                    "OK".into(),
                    text(&cla["cluster_name"]),
                ]);
            }
        }
    }
    table(&rows)
}

fn secrets_table(items: &[Value]) -> String {
    let mut rows = vec![[
        "RESOURCE NAME".to_string(),
        "TYPE".into(),
        "STATUS".into(),
        "VALID CERT".into(),
        "NOT AFTER".into(),
    ]];
    for item in items {
        let secret = &item["secret"];
        let (ty, pem) = if secret["tls_certificate"].is_object() {
            (
                "Cert Chain",
                &secret["tls_certificate"]["certificate_chain"]["inline_bytes"],
            )
        } else {
            (
                "CA",
                &secret["validation_context"]["trusted_ca"]["inline_bytes"],
            )
        };
        let not_after = pem
            .as_str()
            .and_then(crate::ca::not_after_of_base64_pem)
            .unwrap_or_else(|| "-".into());
        rows.push([
            text(&item["name"]),
            ty.into(),
            "ACTIVE".into(),
            (not_after != "-").to_string(),
            not_after,
        ]);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn proxy_status_shows_a_vhds_column_only_when_a_proxy_uses_vhds() {
        let synced = json!({"nonce_sent": "n1", "nonce_acked": "n1"});
        let proxy = |name: &str, types: Value| {
            json!({"proxy": format!("sidecar~10.0.0.1~{name}~shop.svc.cluster.local"),
                   "cluster_id": "Kubernetes", "istio_version": "1.28.0", "types": types})
        };
        let plain = json!({"cds": synced, "lds": synced, "eds": synced,
                           "rds": {"nonce_sent": "n2", "nonce_acked": "n1"}});
        let without = json!([proxy("a-1.shop", plain.clone())]);
        assert_eq!(
            status_table(&without, "canary"),
            "NAME      CLUSTER     CDS     LDS     EDS     RDS    SDS       REVISION  VERSION\n\
             a-1.shop  Kubernetes  SYNCED  SYNCED  SYNCED  STALE  NOT SENT  canary    1.28.0\n"
        );
        let mut on_vhds = plain.clone();
        on_vhds["vhds"] = synced.clone();
        let with = json!([proxy("b-1.shop", on_vhds), proxy("a-1.shop", plain)]);
        assert_eq!(
            status_table(&with, "default"),
            "NAME      CLUSTER     CDS     LDS     EDS     RDS    VHDS      SDS       REVISION  VERSION\n\
             a-1.shop  Kubernetes  SYNCED  SYNCED  SYNCED  STALE  NOT SENT  NOT SENT  default   1.28.0\n\
             b-1.shop  Kubernetes  SYNCED  SYNCED  SYNCED  STALE  SYNCED    NOT SENT  default   1.28.0\n"
        );
    }

    #[test]
    fn a_rejected_type_reads_error_as_istioctl_shows_it() {
        let types = json!({
            "cds": {"nonce_sent": "n2", "nonce_acked": "n1", "rejected": true},
            "lds": {"nonce_sent": "n2", "nonce_acked": "n1", "rejected": false},
        });
        assert_eq!(type_state(&types, "cds"), "ERROR");
        assert_eq!(type_state(&types, "lds"), "STALE");
    }

    #[test]
    fn a_comparison_names_what_only_one_side_has_and_each_field_that_differs() {
        let ours = BTreeMap::from([
            (
                "a".to_string(),
                json!({"name": "a", "timeout": "1s", "hosts": ["x", "y"]}),
            ),
            ("b".to_string(), json!({"name": "b"})),
        ]);
        let theirs = BTreeMap::from([
            (
                "a".to_string(),
                json!({"name": "a", "timeout": "2s", "hosts": ["x", "z"], "extra": 1}),
            ),
            ("c".to_string(), json!({"name": "c"})),
        ]);
        assert_eq!(
            resources_diff(&ours, &theirs),
            "  ~ a /extra: meshd null, Envoy 1\n\
             \x20 ~ a /hosts/1: meshd \"y\", Envoy \"z\"\n\
             \x20 ~ a /timeout: meshd \"1s\", Envoy \"2s\"\n\
             \x20 - b: served by meshd, not held by Envoy\n\
             \x20 + c: held by Envoy, not served by meshd\n"
        );
        assert_eq!(resources_diff(&ours, &ours), "");
    }

    #[test]
    fn tables_align_their_columns() {
        let rows = [
            ["NAME".to_string(), "CDS".into()],
            ["productpage-1.shop".into(), "SYNCED".into()],
        ];
        assert_eq!(
            table(&rows),
            "NAME                CDS\nproductpage-1.shop  SYNCED\n"
        );
        assert_eq!(
            query_escape("router~1.2.3.4~a.b~x"),
            "router%7E1.2.3.4%7Ea.b%7Ex"
        );
    }
}
