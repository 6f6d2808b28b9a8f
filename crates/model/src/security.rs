//! Which PeerAuthentication, RequestAuthentications and AuthorizationPolicies apply to a
//! proxy, resolved as Istio does: a workload-level PeerAuthentication (selector matches,
//! same namespace) over the namespace's selector-less one over the mesh-wide one in the
//! root namespace; port-level mTLS over the workload's mode; `UNSET` inherits; nothing at
//! all means PERMISSIVE. RequestAuthentications and AuthorizationPolicies all apply
//! together: the root namespace's and the proxy's namespace's, without a selector or with
//! one matching the proxy.

use serde::Serialize;

use super::{Proxy, PushContext};
use crate::config::{ConfigObject, Spec};
use api::labels_match;
use api::security::{
    AuthorizationPolicySpec, JwtRule, MtlsMode, PeerAuthenticationSpec, RequestAuthenticationSpec,
};

/// The effective mTLS mode of one inbound port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Mtls {
    Strict,
    Permissive,
    Disable,
}

impl Mtls {
    fn from(mode: MtlsMode) -> Option<Mtls> {
        match mode {
            MtlsMode::Strict => Some(Mtls::Strict),
            MtlsMode::Permissive => Some(Mtls::Permissive),
            MtlsMode::Disable => Some(Mtls::Disable),
            MtlsMode::Unset => None,
        }
    }
}

/// Where an effective mode came from, for `/debug/authenticationz`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MtlsDecision {
    pub mode: Mtls,
    /// `namespace/name` of the deciding PeerAuthentication, or `default`.
    pub policy: String,
}

fn pa(obj: &ConfigObject) -> Option<&PeerAuthenticationSpec> {
    match &obj.spec {
        Spec::PeerAuthentication(s) => Some(s),
        _ => None,
    }
}

impl PushContext {
    /// The PeerAuthentications that apply to `proxy`, most specific first: workload,
    /// namespace, mesh. Of several at one level, the oldest wins (Istio's rule).
    fn peer_authentications_for(&self, proxy: &Proxy) -> Vec<&ConfigObject> {
        let labels = self.proxy_labels(proxy);
        let root = self.mesh.root_namespace();
        let level = |want_selector: bool, namespace: &str| {
            self.peer_authentications
                .iter()
                .map(|o| &**o)
                .filter(|o| o.key.namespace == namespace)
                .find(|o| {
                    let Some(spec) = pa(o) else { return false };
                    match (&spec.selector, want_selector) {
                        (Some(sel), true) => {
                            !sel.match_labels.is_empty() && labels_match(&sel.match_labels, labels)
                        }
                        (Some(sel), false) => sel.match_labels.is_empty(),
                        (None, false) => true,
                        (None, true) => false,
                    }
                })
        };
        [
            level(true, &proxy.namespace),
            level(false, &proxy.namespace),
            level(false, root),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    /// The effective mTLS mode for inbound traffic to `port` (the workload's port) of
    /// `proxy`.
    pub fn mtls_mode(&self, proxy: &Proxy, port: u32) -> MtlsDecision {
        for obj in self.peer_authentications_for(proxy) {
            let Some(spec) = pa(obj) else { continue };
            let name = obj.key.namespaced_name();
            // Port-level settings apply only on a workload-level policy (with a selector).
            if spec.selector.is_some()
                && let Some(mode) = spec
                    .port_level_mtls
                    .get(&port)
                    .and_then(|m| m.mode)
                    .and_then(Mtls::from)
            {
                return MtlsDecision { mode, policy: name };
            }
            if let Some(mode) = spec.mtls.as_ref().and_then(|m| m.mode).and_then(Mtls::from) {
                return MtlsDecision { mode, policy: name };
            }
        }
        MtlsDecision {
            mode: Mtls::Permissive,
            policy: "default".into(),
        }
    }

    /// The JWT rules of the RequestAuthentications that apply to `proxy` (the root
    /// namespace's and its namespace's, selector-less or selecting it), sorted by issuer as
    /// istiod's `newPolicyApplier` sorts them.
    pub fn jwt_rules_for(&self, proxy: &Proxy) -> Vec<&JwtRule> {
        let labels = self.proxy_labels(proxy);
        let root = self.mesh.root_namespace();
        let mut rules: Vec<&JwtRule> = (self.request_authentications.iter())
            .filter_map(|o| match &o.spec {
                Spec::RequestAuthentication(spec) => Some((&**o, spec)),
                _ => None,
            })
            .filter(|(o, spec)| {
                let selects = (spec.selector.as_ref())
                    .is_none_or(|sel| labels_match(&sel.match_labels, labels));
                selects && (o.key.namespace == proxy.namespace || o.key.namespace == root)
            })
            .flat_map(|(_, spec): (_, &RequestAuthenticationSpec)| spec.jwt_rules.iter())
            .collect();
        rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
        rules
    }

    /// The key sets meshd must fetch: those of every rule without an inline `jwks`, with
    /// the longest `timeout` a rule gives each and the objects naming it.
    pub fn jwks_sources(&self) -> crate::jwks::Wanted {
        let mut wanted = crate::jwks::Wanted::new();
        for o in self.request_authentications.iter() {
            let Spec::RequestAuthentication(spec) = &o.spec else {
                continue;
            };
            for rule in spec.jwt_rules.iter().filter(|r| r.jwks.is_none()) {
                let source = crate::jwks::JwksSource::of(rule);
                let timeout = (rule.timeout.as_deref())
                    .and_then(|t| api::duration::parse(t).ok())
                    .unwrap_or(crate::jwks::DEFAULT_TIMEOUT);
                let entry = wanted.entry(source).or_default();
                entry.0 = entry.0.max(timeout);
                entry.1.insert(o.key.clone());
            }
        }
        wanted
    }

    /// The key set Envoy checks `rule`'s tokens against: its inline `jwks`, else what
    /// meshd fetched, else (not fetched yet, or every fetch failed) one no token verifies
    /// against, as istiod fails closed.
    pub fn key_set<'a>(&'a self, rule: &'a JwtRule) -> &'a str {
        if let Some(inline) = &rule.jwks {
            return inline;
        }
        let source = crate::jwks::JwksSource::of(rule);
        match self.store.jwks(&source.key()) {
            Some(Some(fetched)) => fetched,
            _ => crate::jwks::fail_closed(),
        }
    }

    /// The Telemetry resources that apply to `proxy`, least specific first, as istiod's
    /// `applicableTelemetries` orders them: the root namespace's first selector-less one,
    /// then the proxy's namespace's, then each of its namespace's that selects it.
    pub fn telemetries_for(&self, proxy: &Proxy) -> Vec<&api::telemetry::TelemetrySpec> {
        if self.telemetries.is_empty() {
            return Vec::new();
        }
        let labels = self.proxy_labels(proxy);
        let root = self.mesh.root_namespace();
        let specs = || {
            (self.telemetries.iter()).filter_map(|o| match &o.spec {
                Spec::Telemetry(t) => Some((&o.key.namespace, t)),
                _ => None,
            })
        };
        let selectorless = |t: &api::telemetry::TelemetrySpec| {
            t.selector
                .as_ref()
                .is_none_or(|s| s.match_labels.is_empty())
        };
        let namespace_wide = |ns: &str| {
            specs()
                .find(|(n, t)| n.as_str() == ns && selectorless(t))
                .map(|(_, t)| t)
        };
        let mut out = Vec::new();
        out.extend(namespace_wide(root));
        if proxy.namespace != root {
            out.extend(namespace_wide(&proxy.namespace));
        }
        out.extend(specs().filter_map(|(n, t)| {
            let sel = t.selector.as_ref().filter(|s| !s.match_labels.is_empty())?;
            (*n == proxy.namespace && labels_match(&sel.match_labels, labels)).then_some(t)
        }));
        out
    }

    /// The `accessLogging` lists of [`Self::telemetries_for`] that have entries.
    pub fn access_logging_for(&self, proxy: &Proxy) -> Vec<&[api::telemetry::AccessLogging]> {
        (self.telemetries_for(proxy).into_iter())
            .map(|t| t.access_logging.as_slice())
            .filter(|l| !l.is_empty())
            .collect()
    }

    /// The `tracing` entries of [`Self::telemetries_for`], least specific first.
    pub fn tracing_for(&self, proxy: &Proxy) -> Vec<&api::telemetry::TracingEntry> {
        (self.telemetries_for(proxy).into_iter())
            .flat_map(|t| t.tracing.iter())
            .collect()
    }

    /// Whether any Telemetry resource configures tracing.
    pub fn telemetry_traces(&self) -> bool {
        (self.telemetries.iter())
            .any(|o| matches!(&o.spec, Spec::Telemetry(t) if !t.tracing.is_empty()))
    }

    /// The AuthorizationPolicies that apply to `proxy`: the root namespace's selector-less
    /// ones (mesh-wide), its namespace's selector-less ones, and those whose selector
    /// matches it; in namespace/name order.
    pub fn authorization_policies_for(
        &self,
        proxy: &Proxy,
    ) -> Vec<(&ConfigObject, &AuthorizationPolicySpec)> {
        let labels = self.proxy_labels(proxy);
        let root = self.mesh.root_namespace();
        self.authorization_policies
            .iter()
            .filter_map(|o| match &o.spec {
                Spec::AuthorizationPolicy(spec) => Some((&**o, spec)),
                _ => None,
            })
            .filter(|(o, spec)| {
                let selects = spec
                    .selector
                    .as_ref()
                    .is_none_or(|sel| labels_match(&sel.match_labels, labels));
                selects && (o.key.namespace == proxy.namespace || o.key.namespace == root)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::builders::{context, istio, sidecar};
    use crate::config::Kind;

    fn proxy(ns: &str, app: &str) -> Proxy {
        sidecar(ns, &format!("{app}-0"), "10.0.0.1", &[("app", app)])
    }

    #[test]
    fn the_most_specific_peer_authentication_decides_and_unset_inherits() {
        let pa = |name, ns, spec| istio(Kind::PeerAuthentication, ns, name, spec);
        let c = context([
            pa("mesh", "istio-system", json!({"mtls": {"mode": "STRICT"}})),
            pa("ns", "shop", json!({"mtls": {"mode": "PERMISSIVE"}})),
            pa(
                "reviews",
                "shop",
                json!({
                    "selector": {"matchLabels": {"app": "reviews"}},
                    "mtls": {"mode": "UNSET"},
                    "portLevelMtls": {"9080": {"mode": "DISABLE"}},
                }),
            ),
        ]);
        let mode = |ns: &str, app: &str, port: u32| c.mtls_mode(&proxy(ns, app), port);
        assert_eq!(mode("bank", "teller", 80).mode, Mtls::Strict, "mesh-wide");
        assert_eq!(mode("bank", "teller", 80).policy, "istio-system/mesh");
        assert_eq!(mode("shop", "cart", 80).mode, Mtls::Permissive, "namespace");
        assert_eq!(
            mode("shop", "reviews", 9080).mode,
            Mtls::Disable,
            "port level"
        );
        let inherited = mode("shop", "reviews", 8080);
        assert_eq!(
            (inherited.mode, inherited.policy.as_str()),
            (Mtls::Permissive, "shop/ns"),
            "UNSET inherits from the namespace"
        );
        assert_eq!(
            context([]).mtls_mode(&proxy("a", "b"), 1).mode,
            Mtls::Permissive
        );
    }

    #[test]
    fn authorization_policies_apply_by_namespace_root_and_selector() {
        let ap = |name, ns, spec| istio(Kind::AuthorizationPolicy, ns, name, spec);
        let c = context([
            ap(
                "mesh",
                "istio-system",
                json!({"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/admin"]}}]}]}),
            ),
            ap("all-shop", "shop", json!({})),
            ap(
                "reviews",
                "shop",
                json!({"selector": {"matchLabels": {"app": "reviews"}}}),
            ),
            ap("bank", "bank", json!({})),
        ]);
        let names = |ns: &str, app: &str| -> Vec<String> {
            c.authorization_policies_for(&proxy(ns, app))
                .iter()
                .map(|(o, _)| o.key.name.clone())
                .collect()
        };
        assert_eq!(names("shop", "reviews"), ["mesh", "all-shop", "reviews"]);
        assert_eq!(names("shop", "cart"), ["mesh", "all-shop"]);
        assert_eq!(names("web", "x"), ["mesh"]);
    }
}
