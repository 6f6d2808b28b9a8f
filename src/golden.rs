//! Golden files: a mesh's YAML in, each listed proxy's configuration out, as the JSON of
//! Envoy's `/config_dump` (what `/debug/config_dump?proxyID=` serves), assembled by the
//! same cache every connected proxy is served from.
//!
//! Each case is a directory under `tests/golden/` with a `case.yaml`:
//! `config` lists files or directories of YAML (relative to the repository's top), and
//! `proxies` names each proxy with its node id, metadata and, for a proxy connected to
//! the secure port, the identity it proved; `NAME.json` next to it holds
//! the expected configuration of proxy NAME. `MESHD_UPDATE_GOLDEN=1 cargo test` writes
//! them anew, to be reviewed as a diff.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::dump::config_dump;
use model::config::parse::parse_file;
use model::{Proxy, PushContext, Store};
use xds::cache::{ResourceCache, view};

#[derive(Deserialize)]
struct Case {
    config: Vec<PathBuf>,
    proxies: Vec<CaseProxy>,
}

#[derive(Deserialize)]
struct CaseProxy {
    name: String,
    id: String,
    #[serde(default)]
    metadata: serde_json::Map<String, serde_json::Value>,
    /// The SPIFFE identity the proxy's connection proved, as on the secure port.
    #[serde(default)]
    identity: Option<String>,
}

fn top() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The store of a case's configuration; an invalid object fails the case.
fn store(case: &Case) -> Store {
    let mut objects = Vec::new();
    for entry in &case.config {
        for file in crate::filesource::yaml_files(&top().join(entry)).unwrap() {
            let text = std::fs::read_to_string(&file).unwrap();
            let parsed = parse_file(&file.display().to_string(), &text);
            assert!(
                parsed.errors().next().is_none(),
                "{}: {:?}",
                file.display(),
                parsed.issues
            );
            objects.extend(parsed.objects);
        }
    }
    objects.into_iter().collect()
}

/// The differences between `want` and `got` as JSON pointers, at most `limit`.
fn differences(want: &serde_json::Value, got: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    if out.len() >= 20 {
        return;
    }
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for key in w.keys().chain(g.keys().filter(|k| !w.contains_key(*k))) {
                let path = format!("{at}/{key}");
                match (w.get(key), g.get(key)) {
                    (Some(a), Some(b)) => differences(a, b, &path, out),
                    (a, b) => out.push(format!("{path}: {a:?} != {b:?}")),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                differences(a, b, &format!("{at}/{i}"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{at}: {a} != {b}")),
        _ => {}
    }
}

#[test]
fn every_golden_case_gives_each_proxy_its_expected_configuration() {
    let root = top().join("tests/golden");
    let update = std::env::var_os("MESHD_UPDATE_GOLDEN").is_some();
    let mut checked = 0;
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.yaml").is_file())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no cases under {}", root.display());
    let mut failures = Vec::new();
    for dir in cases {
        let case: Case =
            serde_saphyr::from_str(&std::fs::read_to_string(dir.join("case.yaml")).unwrap())
                .unwrap();
        let context = PushContext::build(&store(&case), "golden/1".into());
        let cache = ResourceCache::default();
        for p in &case.proxies {
            let mut proxy = Proxy::from_node(&p.id, &p.metadata).unwrap();
            proxy.identity = p.identity.clone();
            let got = config_dump(&view(&context, &proxy, &cache), "golden/1", "", None);
            let file = dir.join(format!("{}.json", p.name));
            if update {
                std::fs::write(&file, format!("{got:#}\n")).unwrap();
                continue;
            }
            let want: serde_json::Value = match std::fs::read_to_string(&file) {
                Ok(text) => serde_json::from_str(&text).unwrap(),
                Err(e) => panic!("{}: {e}; MESHD_UPDATE_GOLDEN=1 writes it", file.display()),
            };
            let mut diff = Vec::new();
            differences(&want, &got, "", &mut diff);
            if !diff.is_empty() {
                failures.push(format!("{}:\n  {}", file.display(), diff.join("\n  ")));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "proxies' configuration differs from the golden files (MESHD_UPDATE_GOLDEN=1 cargo test writes them; review the diff):\n{}",
        failures.join("\n")
    );
    assert!(update || checked > 0);
}
