//! The Kubernetes fake: an in-process API server speaking the list/watch protocol the
//! kube client uses — lists with a resourceVersion, watches as newline-delimited JSON
//! events with history replay from a resourceVersion, `410 Gone` for expired versions,
//! dropped streams, and lists that can be held back. `meshd loadgen --kubernetes` serves
//! its mesh from it and makes its changes through it, as kubectl would; the end-to-end
//! tests also use it for leases, status patches, Secrets and TokenReviews.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::thread;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnboundedReceiverStream;

/// An open watch: the namespace it is limited to (if any) and its stream.
type Watch = (Option<String>, mpsc::UnboundedSender<Bytes>);

#[derive(Default)]
struct Inner {
    rv: u64,
    /// plural -> (namespace, name) -> object
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    /// plural -> (resourceVersion, event)
    history: BTreeMap<String, Vec<(u64, Value)>>,
    /// plural -> open watches (with the namespace they are limited to, if any)
    watchers: BTreeMap<String, Vec<Watch>>,
    /// Watches from a resourceVersion below this get `410 Gone`.
    expired_below: u64,
    /// Kinds whose lists answer 503 for now.
    held: BTreeSet<String>,
    /// Every list request, by plural.
    lists: BTreeMap<String, usize>,
    /// Status patches, by "plural/namespace/name".
    patches: BTreeMap<String, usize>,
    /// The top-level `status` fields each field manager applied last, by
    /// "plural/namespace/name/manager".
    status_owners: BTreeMap<String, BTreeSet<String>>,
    /// Leases, by "namespace/name".
    leases: BTreeMap<String, Value>,
    /// Service-account tokens TokenReview knows: token -> (username, audiences, expired).
    tokens: BTreeMap<String, (String, Vec<String>, bool)>,
    /// TokenReview requests answered.
    token_reviews: usize,
}

#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<Mutex<Inner>>,
    pub port: u16,
}

fn known_plural(kind: &str) -> Option<&'static str> {
    if kind == "ValidatingWebhookConfiguration" {
        return Some("validatingwebhookconfigurations");
    }
    crate::config::Kind::ALL
        .into_iter()
        .find(|k| k.as_str() == kind)
        .map(|k| k.plural())
}

/// The plural of a kind a caller names; an unknown kind is the caller's bug.
fn plural_of(kind: &str) -> &'static str {
    known_plural(kind).unwrap_or_else(|| panic!("BUG: the fake does not serve kind {kind}"))
}

/// The watch event of an expired resourceVersion: `410 Gone`.
fn gone() -> Value {
    json!({"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": "too old resource version", "reason": "Expired", "code": 410}})
}

fn line(event: &Value) -> Bytes {
    let mut s = event.to_string();
    s.push('\n');
    Bytes::from(s)
}

impl FakeApiServer {
    /// Starts serving on a free loopback port, on a thread of its own.
    pub fn start() -> std::io::Result<FakeApiServer> {
        let inner = Arc::new(Mutex::new(Inner {
            rv: 100,
            ..Default::default()
        }));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let state = inner.clone();
        thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener)?;
                    let app = Router::new().fallback(handle).with_state(state);
                    axum::serve(listener, app).await
                })
            })?;
        Ok(FakeApiServer { inner, port })
    }

    /// Writes `dir/kubeconfig`, pointing at this server, and returns its path.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> std::io::Result<std::path::PathBuf> {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://127.0.0.1:{}\"}}}}]\nusers: [{{name: fake, user: {{token: test}}}}]\ncontexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\ncurrent-context: fake\n",
                self.port
            ),
        )?;
        Ok(path)
    }

    /// Creates or replaces objects given as YAML (several documents allowed), as
    /// `kubectl apply` does: an object equal to the one held is left alone.
    pub fn apply_yaml(&self, yaml: &str) -> Result<(), String> {
        let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(|e| e.to_string())?;
        for doc in docs.into_iter().filter(|d| !d.is_null()) {
            self.apply(doc)?;
        }
        Ok(())
    }

    pub fn apply(&self, obj: Value) -> Result<(), String> {
        let kind = obj["kind"].as_str().unwrap_or_default();
        if known_plural(kind).is_none() {
            return Err(format!("the fake API server does not serve kind {kind:?}"));
        }
        if !obj["metadata"]["name"].is_string() {
            return Err(format!("a {kind} without metadata.name"));
        }
        apply_locked(&mut self.inner.lock().unwrap(), obj);
        Ok(())
    }

    /// A service-account token that TokenReview accepts for `audiences` (or reports as
    /// expired).
    pub fn add_token(&self, token: &str, ns: &str, sa: &str, audiences: &[&str], expired: bool) {
        self.inner.lock().unwrap().tokens.insert(
            token.to_string(),
            (
                format!("system:serviceaccount:{ns}:{sa}"),
                audiences.iter().map(|a| a.to_string()).collect(),
                expired,
            ),
        );
    }

    pub fn token_reviews(&self) -> usize {
        self.inner.lock().unwrap().token_reviews
    }

    pub fn delete(&self, kind: &str, namespace: &str, name: &str) {
        let plural = plural_of(kind);
        let mut inner = self.inner.lock().unwrap();
        let Some(mut obj) = inner
            .objects
            .entry(plural.into())
            .or_default()
            .remove(&(namespace.into(), name.into()))
        else {
            return;
        };
        inner.rv += 1;
        let rv = inner.rv;
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        Self::publish(
            &mut inner,
            plural,
            rv,
            json!({"type": "DELETED", "object": obj}),
        );
    }

    fn publish(inner: &mut Inner, plural: &str, rv: u64, event: Value) {
        inner
            .history
            .entry(plural.into())
            .or_default()
            .push((rv, event.clone()));
        let ns = event["object"]["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if let Some(ws) = inner.watchers.get_mut(plural) {
            ws.retain(|(only, w)| {
                only.as_ref().is_some_and(|o| *o != ns) || w.send(line(&event)).is_ok()
            });
        }
    }

    /// Compacts history: open watches get `410 Gone` and close; the clients must relist.
    pub fn expire_watches(&self) {
        let mut inner = self.inner.lock().unwrap();
        // History up to now is compacted: a watch must start from a fresh list.
        inner.rv += 1;
        inner.expired_below = inner.rv;
        let gone = gone();
        for (_, ws) in std::mem::take(&mut inner.watchers) {
            for (_, w) in ws {
                let _ = w.send(line(&gone));
            }
        }
    }

    /// Closes every open watch stream, as a load balancer or API server restart would.
    pub fn drop_watches(&self) {
        self.inner.lock().unwrap().watchers.clear();
    }

    /// Makes lists of `kind` fail (503) until [`FakeApiServer::release`].
    pub fn hold(&self, kind: &str) {
        self.inner
            .lock()
            .unwrap()
            .held
            .insert(plural_of(kind).into());
    }

    pub fn release(&self, kind: &str) {
        self.inner.lock().unwrap().held.remove(plural_of(kind));
    }

    pub fn list_requests(&self, kind: &str) -> usize {
        self.inner
            .lock()
            .unwrap()
            .lists
            .get(plural_of(kind))
            .copied()
            .unwrap_or(0)
    }

    /// The object as the API server holds it now.
    pub fn object(&self, kind: &str, namespace: &str, name: &str) -> Value {
        let inner = self.inner.lock().unwrap();
        let objects = inner.objects.get(plural_of(kind));
        objects
            .and_then(|m| m.get(&(namespace.into(), name.into())))
            .cloned()
            .unwrap_or(Value::Null)
    }

    pub fn status_patches(&self, kind: &str, namespace: &str, name: &str) -> usize {
        let key = format!("{}/{namespace}/{name}", plural_of(kind));
        self.inner
            .lock()
            .unwrap()
            .patches
            .get(&key)
            .copied()
            .unwrap_or(0)
    }

    pub fn lease_holder(&self, namespace: &str, name: &str) -> Option<String> {
        let inner = self.inner.lock().unwrap();
        let lease = inner.leases.get(&format!("{namespace}/{name}"))?;
        lease["spec"]["holderIdentity"].as_str().map(str::to_string)
    }

    pub fn open_watches(&self) -> usize {
        self.inner
            .lock()
            .unwrap()
            .watchers
            .values()
            .map(Vec::len)
            .sum()
    }
}

/// `/api/v1/PLURAL`, `/apis/GROUP/VERSION/PLURAL`, or either under `namespaces/NS/`:
/// the plural and the namespace the request is limited to.
fn plural_from_path(path: &str) -> Option<(String, Option<String>)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", plural] | ["apis", _, _, plural] => Some((plural.to_string(), None)),
        ["api", "v1", "namespaces", ns, plural] | ["apis", _, _, "namespaces", ns, plural] => {
            Some((plural.to_string(), Some(ns.to_string())))
        }
        _ => None,
    }
}

fn apply_locked(inner: &mut Inner, mut obj: Value) -> Value {
    let plural = plural_of(obj["kind"].as_str().unwrap_or_default());
    let ns = obj["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let previous = inner
        .objects
        .get(plural)
        .and_then(|m| m.get(&(ns.clone(), name.clone())))
        .cloned();
    // As the API server does: an update that changes nothing is no update (no new
    // resourceVersion, no watch event).
    if let Some(p) = &previous {
        let mut same = obj.clone();
        for field in ["resourceVersion", "generation"] {
            same["metadata"][field] = p["metadata"][field].clone();
        }
        if same.get("status").is_none() && p.get("status").is_some() {
            same["status"] = p["status"].clone();
        }
        if same == *p {
            return same;
        }
    }
    inner.rv += 1;
    let rv = inner.rv;
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    // As the API server does: generation counts spec changes; status is kept.
    let generation = match &previous {
        None => 1,
        Some(p) if p["spec"] == obj["spec"] => p["metadata"]["generation"].as_i64().unwrap_or(1),
        Some(p) => p["metadata"]["generation"].as_i64().unwrap_or(1) + 1,
    };
    obj["metadata"]["generation"] = json!(generation);
    if let Some(status) = previous
        .as_ref()
        .map(|p| p["status"].clone())
        .filter(|s| !s.is_null())
    {
        obj["status"] = status;
    }
    let existed = inner
        .objects
        .entry(plural.into())
        .or_default()
        .insert((ns, name), obj.clone())
        .is_some();
    let event = json!({"type": if existed { "MODIFIED" } else { "ADDED" }, "object": obj});
    FakeApiServer::publish(inner, plural, rv, event);
    obj
}

/// `POST .../tokenreviews`: as the API server answers, including audience checks.
fn token_review(inner: &mut Inner, body: &[u8]) -> Response {
    inner.token_reviews += 1;
    let review: Value = serde_json::from_slice(body).unwrap_or_default();
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    let wanted: Vec<String> =
        serde_json::from_value(review["spec"]["audiences"].clone()).unwrap_or_default();
    let status = match inner.tokens.get(token) {
        None => json!({"authenticated": false, "error": "invalid bearer token"}),
        Some((_, _, true)) => json!({"authenticated": false, "error": "token has expired"}),
        Some((user, audiences, false)) => {
            let granted: Vec<&String> = audiences.iter().filter(|a| wanted.contains(a)).collect();
            if granted.is_empty() && !wanted.is_empty() {
                json!({"authenticated": false, "error": "token audiences is invalid for the target audiences"})
            } else {
                json!({"authenticated": true, "user": {"username": user}, "audiences": granted})
            }
        }
    };
    json_response(
        &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": review["spec"], "status": status}),
    )
}

/// Get, create and replace of one namespaced object (the CA's Secrets).
fn crud(
    inner: &mut Inner,
    method: &Method,
    plural: &str,
    ns: &str,
    name: Option<&str>,
    body: &[u8],
) -> Response {
    let existing = |inner: &Inner, name: &str| {
        inner
            .objects
            .get(plural)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
    };
    let Ok(mut obj) = serde_json::from_slice::<Value>(body).or_else(|_| {
        if body.is_empty() {
            Ok(Value::Null)
        } else {
            Err(())
        }
    }) else {
        return status(400, "BadRequest", "body is not JSON");
    };
    match (method.as_str(), name) {
        ("GET", Some(name)) => match existing(inner, name) {
            Some(o) => json_response(&o),
            None => status(404, "NotFound", "not found"),
        },
        ("POST", None) => {
            let name = obj["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if existing(inner, &name).is_some() {
                return status(409, "AlreadyExists", "already exists");
            }
            obj["metadata"]["namespace"] = json!(ns);
            json_response(&apply_locked(inner, obj))
        }
        ("PUT", Some(name)) => {
            if existing(inner, name).is_none() {
                return status(404, "NotFound", "not found");
            }
            obj["metadata"]["namespace"] = json!(ns);
            json_response(&apply_locked(inner, obj))
        }
        _ => status(405, "MethodNotAllowed", "not supported by the fake"),
    }
}

/// The API server's validating admission of a create, as far as meshd's webhook needs it:
/// every webhook of every ValidatingWebhookConfiguration whose rules name the object's
/// group and resource for CREATE is called over HTTPS at its `clientConfig.url`, trusting
/// its `caBundle` (a `service` reference is not reachable from the fake). A denial refuses
/// the create with the webhook's message, as Kubernetes words it; an unreachable webhook
/// refuses it only with `failurePolicy: Fail` (the default).
async fn admit(
    inner: &Arc<Mutex<Inner>>,
    group: &str,
    plural: &str,
    obj: &Value,
) -> Result<(), Response> {
    let configs: Vec<Value> = (inner.lock().unwrap().objects)
        .get("validatingwebhookconfigurations")
        .map(|m| m.values().cloned().collect())
        .unwrap_or_default();
    let names =
        |v: &Value, want: &str| (v.as_array().into_iter().flatten()).any(|x| x == "*" || x == want);
    for webhook in configs
        .iter()
        .flat_map(|c| c["webhooks"].as_array().cloned().unwrap_or_default())
    {
        let applies = (webhook["rules"].as_array().into_iter().flatten()).any(|r| {
            names(&r["operations"], "CREATE")
                && names(&r["apiGroups"], group)
                && names(&r["resources"], plural)
        });
        if !applies {
            continue;
        }
        let name = webhook["name"].as_str().unwrap_or_default();
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": format!("fake-{}", inner.lock().unwrap().rv),
                "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
                "resource": {"group": group, "version": "v1", "resource": plural},
                "namespace": obj["metadata"]["namespace"],
                "name": obj["metadata"]["name"],
                "operation": "CREATE",
                "object": obj,
                "dryRun": true,
            },
        });
        let url = webhook["clientConfig"]["url"].as_str();
        let bundle = webhook["clientConfig"]["caBundle"]
            .as_str()
            .unwrap_or_default();
        let answer = match url {
            Some(url) => call_webhook(url, bundle, &review.to_string()).await,
            None => Err("the fake reaches webhooks by clientConfig.url only".to_string()),
        };
        match answer {
            Ok(response) if response["response"]["allowed"] == true => {}
            Ok(response) => {
                let message = response["response"]["status"]["message"]
                    .as_str()
                    .unwrap_or_default();
                let message = format!("admission webhook {name:?} denied the request: {message}");
                return Err(status(400, "BadRequest", &message));
            }
            Err(e) if webhook["failurePolicy"] == "Ignore" => {
                tracing::debug!(webhook = name, "ignored, unreachable: {e}");
            }
            Err(e) => {
                let message =
                    format!("Internal error occurred: failed calling webhook {name:?}: {e}");
                return Err(status(500, "InternalError", &message));
            }
        }
    }
    Ok(())
}

/// POSTs `body` to an `https://HOST:PORT/PATH` webhook trusting the base64 PEM `bundle`,
/// over HTTP/1.1, and reads the JSON answer.
async fn call_webhook(url: &str, bundle: &str, body: &str) -> Result<Value, String> {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("https://").ok_or("not an https URL")?;
    let (authority, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let host = authority
        .rsplit_once(':')
        .map_or(authority, |(h, _)| h)
        .to_string();
    let pem = base64::engine::general_purpose::STANDARD
        .decode(bundle)
        .map_err(|e| format!("caBundle: {e}"))?;
    let pem = String::from_utf8(pem).map_err(|e| format!("caBundle: {e}"))?;
    let mut config = crate::tls::client_config(&pem, None).map_err(|e| format!("caBundle: {e}"))?;
    config.alpn_protocols.clear();
    let name = rustls::pki_types::ServerName::try_from(host.clone()).map_err(|e| e.to_string())?;
    let tcp = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "answered {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    serde_json::from_str(body).map_err(|e| format!("answer: {e}"))
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn json_response(v: &Value) -> Response {
    ([("content-type", "application/json")], v.to_string()).into_response()
}

/// `PATCH /apis/G/V/namespaces/NS/PLURAL/NAME/status` (server-side apply of `status`).
/// As server-side apply does to a status whose fields are not in the schema: a field
/// manager's apply sets the fields it names and removes those it applied before and names
/// no more; other managers' fields stay.
fn patch_status(
    inner: &mut Inner,
    (plural, ns, name): (&str, &str, &str),
    manager: &str,
    body: &[u8],
) -> Response {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "patch body is not JSON");
    };
    let key = (ns.to_string(), name.to_string());
    let Some(mut obj) = inner.objects.get(plural).and_then(|m| m.get(&key)).cloned() else {
        return status(404, "NotFound", "no such object");
    };
    inner.rv += 1;
    let rv = inner.rv;
    let applied: BTreeMap<String, Value> = match &patch["status"] {
        Value::Object(m) => m.clone().into_iter().collect(),
        _ => BTreeMap::new(),
    };
    let owned = (inner.status_owners)
        .insert(
            format!("{plural}/{ns}/{name}/{manager}"),
            applied.keys().cloned().collect(),
        )
        .unwrap_or_default();
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    let current = obj["status"].as_object_mut().unwrap();
    for gone in owned.iter().filter(|k| !applied.contains_key(*k)) {
        current.remove(gone);
    }
    current.extend(applied);
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    inner
        .objects
        .get_mut(plural)
        .unwrap()
        .insert(key, obj.clone());
    *inner
        .patches
        .entry(format!("{plural}/{ns}/{name}"))
        .or_default() += 1;
    FakeApiServer::publish(
        inner,
        plural,
        rv,
        json!({"type": "MODIFIED", "object": obj}),
    );
    json_response(&obj)
}

/// Leases: get, create, and replace with optimistic concurrency.
fn lease(
    inner: &mut Inner,
    method: &Method,
    ns: &str,
    name: Option<&str>,
    body: &[u8],
) -> Response {
    let parsed: Value = serde_json::from_slice(body).unwrap_or_default();
    match (method.as_str(), name) {
        ("GET", Some(name)) => match inner.leases.get(&format!("{ns}/{name}")) {
            Some(l) => json_response(l),
            None => status(404, "NotFound", "lease not found"),
        },
        ("POST", None) => {
            let mut l = parsed;
            let key = format!(
                "{ns}/{}",
                l["metadata"]["name"].as_str().unwrap_or_default()
            );
            if inner.leases.contains_key(&key) {
                return status(409, "AlreadyExists", "lease exists");
            }
            inner.rv += 1;
            l["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            l["metadata"]["namespace"] = json!(ns);
            inner.leases.insert(key, l.clone());
            json_response(&l)
        }
        ("PUT", Some(name)) => {
            let mut l = parsed;
            let key = format!("{ns}/{name}");
            let current = inner
                .leases
                .get(&key)
                .map(|c| c["metadata"]["resourceVersion"].clone());
            if current != Some(l["metadata"]["resourceVersion"].clone()) {
                return status(
                    409,
                    "Conflict",
                    "the lease was modified; apply your changes to the latest version",
                );
            }
            inner.rv += 1;
            l["metadata"]["resourceVersion"] = json!(inner.rv.to_string());
            inner.leases.insert(key, l.clone());
            json_response(&l)
        }
        _ => status(405, "MethodNotAllowed", "not supported by the fake"),
    }
}

async fn handle(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    Query(q): Query<BTreeMap<String, String>>,
    body: Bytes,
) -> Response {
    let parts: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    match parts.as_slice() {
        // `.../leases` (create) and `.../leases/NAME` (get, replace).
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            name @ ..,
        ] if name.len() <= 1 => {
            return lease(
                &mut inner.lock().unwrap(),
                &method,
                ns,
                name.first().copied(),
                &body,
            );
        }
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if method == Method::POST => {
            return token_review(&mut inner.lock().unwrap(), &body);
        }
        ["api", "v1", "namespaces", ns, "secrets", name @ ..]
            if name.len() <= 1 && (name.len() == 1 || method == Method::POST) =>
        {
            return crud(
                &mut inner.lock().unwrap(),
                &method,
                "secrets",
                ns,
                name.first().copied(),
                &body,
            );
        }
        // Cluster-scoped webhook configurations: get and replace.
        [
            "apis",
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            name,
        ] => {
            return crud(
                &mut inner.lock().unwrap(),
                &method,
                "validatingwebhookconfigurations",
                "",
                Some(name),
                &body,
            );
        }
        ["apis", _, _, "namespaces", ns, plural, name, "status"] if method == Method::PATCH => {
            let manager = q.get("fieldManager").map_or("", String::as_str);
            let object = (*plural, *ns, *name);
            return patch_status(&mut inner.lock().unwrap(), object, manager, &body);
        }
        // Creating an Istio object (or a dry run of it): admission first.
        ["apis", group, _, "namespaces", ns, plural]
            if method == Method::POST && group.ends_with(".istio.io") =>
        {
            let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            obj["metadata"]["namespace"] = json!(ns);
            if let Err(refused) = admit(&inner, group, plural, &obj).await {
                return refused;
            }
            if q.get("dryRun").is_some_and(|d| d == "All") {
                return (
                    StatusCode::CREATED,
                    [("content-type", "application/json")],
                    obj.to_string(),
                )
                    .into_response();
            }
            return json_response(&apply_locked(&mut inner.lock().unwrap(), obj));
        }
        _ => {}
    }
    let Some((plural, only)) = plural_from_path(uri.path()) else {
        return status(404, "NotFound", "not served by the fake");
    };
    let in_scope = |o: &Value| {
        only.as_deref()
            .is_none_or(|ns| o["metadata"]["namespace"] == ns)
    };
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let mut guard = inner.lock().unwrap();
    if !watch {
        *guard.lists.entry(plural.clone()).or_default() += 1;
        if guard.held.contains(&plural) {
            return (StatusCode::SERVICE_UNAVAILABLE, "held by the test").into_response();
        }
        let items: Vec<Value> = guard
            .objects
            .get(&plural)
            .map(|m| m.values().filter(|o| in_scope(o)).cloned().collect())
            .unwrap_or_default();
        let body = json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": guard.rv.to_string()}, "items": items});
        return ([("content-type", "application/json")], body.to_string()).into_response();
    }
    let from: u64 = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let (tx, rx) = mpsc::unbounded_channel();
    if from < guard.expired_below {
        let gone = gone();
        let _ = tx.send(line(&gone));
        drop(tx);
    } else {
        for (rv, event) in guard.history.get(&plural).into_iter().flatten() {
            if *rv > from && in_scope(&event["object"]) {
                let _ = tx.send(line(event));
            }
        }
        guard.watchers.entry(plural).or_default().push((only, tx));
    }
    drop(guard);
    let stream = UnboundedReceiverStream::new(rx).map(Ok::<_, Infallible>);
    (
        [("content-type", "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(api: &FakeApiServer) -> Value {
        api.object("VirtualService", "shop", "front")["metadata"]["resourceVersion"].clone()
    }

    #[test]
    fn an_apply_that_changes_nothing_is_no_update() {
        let api = FakeApiServer::start().unwrap();
        let vs = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: front, namespace: shop}\nspec: {hosts: [a]}\n";
        api.apply_yaml(vs).unwrap();
        let first = version(&api);
        api.apply_yaml(vs).unwrap();
        assert_eq!(
            version(&api),
            first,
            "the same object again: no new version"
        );
        let history =
            |api: &FakeApiServer| api.inner.lock().unwrap().history["virtualservices"].len();
        assert_eq!(history(&api), 1);
        api.apply_yaml(&vs.replace("[a]", "[b]")).unwrap();
        assert_ne!(version(&api), first);
        assert_eq!(history(&api), 2);
        assert_eq!(
            api.object("VirtualService", "shop", "front")["metadata"]["generation"],
            2
        );
    }

    #[test]
    fn objects_the_fake_cannot_hold_are_refused_by_name() {
        let api = FakeApiServer::start().unwrap();
        let err = api.apply_yaml("apiVersion: v1\nkind: Widget\nmetadata: {name: w}\n");
        assert!(err.unwrap_err().contains("\"Widget\""));
        let err = api.apply_yaml("apiVersion: v1\nkind: Service\nmetadata: {}\n");
        assert!(err.unwrap_err().contains("metadata.name"));
        assert!(api.apply_yaml("kind: [").is_err());
    }
}
