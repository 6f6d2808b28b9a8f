//! The config-directory source: loads every `*.yaml`/`*.yml` under a directory, watches it,
//! and applies adds, edits and deletes to the model.
//!
//! Bad documents never remove good state: an object whose new version is rejected keeps its
//! last accepted version, and a file with a YAML syntax error keeps everything it had.
//! Problems are logged, counted and kept per file for `/debug/configz`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::config::parse::{Parsed, parse_file};
use crate::config::{ConfigIssue, Level, ObjectKey};
use crate::model::Store;

/// Problems found per file, for `/debug/configz`.
pub type IssueBoard = Arc<RwLock<BTreeMap<String, Vec<ConfigIssue>>>>;

/// Called with every problem as it is found (logging and metrics live with the caller).
pub type IssueHook = Arc<dyn Fn(&ConfigIssue) + Send + Sync>;

/// Called with the keys whose stored objects a source changed (both sources use it).
pub type OnChange = Arc<dyn Fn(BTreeSet<ObjectKey>) + Send + Sync>;

#[derive(Default)]
struct FileState {
    hash: u64,
    keys: BTreeSet<ObjectKey>,
}

pub struct FileSource {
    dir: PathBuf,
    store: Arc<RwLock<Store>>,
    files: HashMap<PathBuf, FileState>,
    pub issues: IssueBoard,
    hook: IssueHook,
}

/// Every YAML file under `dir`, sorted (a single file is accepted too).
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    if dir.is_file() {
        return Ok(vec![dir.to_path_buf()]);
    }
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let path = entry?.path();
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

impl FileSource {
    /// A source for `dir`, reporting problems into `issues` and through `hook`.
    pub fn new(
        dir: PathBuf,
        store: Arc<RwLock<Store>>,
        issues: IssueBoard,
        hook: IssueHook,
    ) -> FileSource {
        FileSource {
            dir,
            store,
            files: HashMap::new(),
            issues,
            hook,
        }
    }

    fn display_name(&self, path: &Path) -> String {
        path.strip_prefix(&self.dir)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Re-reads the directory; returns the keys whose stored object changed.
    pub fn sync(&mut self) -> BTreeSet<ObjectKey> {
        let mut changed = BTreeSet::new();
        let files = match yaml_files(&self.dir) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot read config directory; keeping current config");
                return changed;
            }
        };
        let present: BTreeSet<&PathBuf> = files.iter().collect();
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains(p))
            .cloned()
            .collect();
        for path in gone {
            let state = self.files.remove(&path).unwrap_or_default();
            let name = self.display_name(&path);
            tracing::info!(file = %name, objects = state.keys.len(), "config file removed");
            self.issues.write().unwrap().remove(&name);
            let mut store = self.store.write().unwrap();
            for key in state.keys {
                if !self.claimed_elsewhere(&key, &path) && store.delete(&key) {
                    changed.insert(key);
                }
            }
        }
        for path in files {
            let Ok(text) = std::fs::read_to_string(&path) else {
                tracing::warn!(file = %path.display(), "cannot read config file; keeping its last good objects");
                continue;
            };
            let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
            if self.files.get(&path).is_some_and(|s| s.hash == hash) {
                continue;
            }
            let name = self.display_name(&path);
            let parsed = parse_file(&name, &text);
            changed.extend(self.apply_file(&path, hash, parsed));
        }
        changed
    }

    fn claimed_elsewhere(&self, key: &ObjectKey, path: &Path) -> bool {
        self.files
            .iter()
            .any(|(p, s)| p != path && s.keys.contains(key))
    }

    fn apply_file(&mut self, path: &Path, hash: u64, parsed: Parsed) -> BTreeSet<ObjectKey> {
        let name = self.display_name(path);
        for issue in &parsed.issues {
            (self.hook)(issue);
        }
        let previous = self.files.remove(path).unwrap_or_default();
        let mut keys: BTreeSet<ObjectKey> = parsed.objects.iter().map(|o| o.key.clone()).collect();
        // Last good versions stay in force: rejected objects, or all of a file that did not parse.
        let keep: Vec<ObjectKey> = previous
            .keys
            .iter()
            .filter(|k| !keys.contains(*k) && (parsed.syntax_error || parsed.rejected.contains(k)))
            .cloned()
            .collect();
        keys.extend(keep);
        let mut changed = BTreeSet::new();
        {
            let mut store = self.store.write().unwrap();
            for object in parsed.objects {
                let key = object.key.clone();
                if store.apply(object) {
                    changed.insert(key);
                }
            }
            for key in previous.keys.difference(&keys) {
                if !self.claimed_elsewhere(key, path) && store.delete(key) {
                    changed.insert(key.clone());
                }
            }
        }
        let errors = parsed
            .issues
            .iter()
            .filter(|i| i.level == Level::Error)
            .count();
        tracing::info!(file = %name, objects = keys.len(), changed = changed.len(), errors, "config file loaded");
        self.issues.write().unwrap().insert(name, parsed.issues);
        self.files
            .insert(path.to_path_buf(), FileState { hash, keys });
        changed
    }

    /// Watches the directory and calls `on_change` with the changed keys after each burst
    /// of file events. Runs until `shutdown` fires.
    pub async fn watch(
        mut self,
        on_change: OnChange,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok() {
                    let _ = tx.send(());
                }
            })?;
        watcher.watch(&self.dir, RecursiveMode::Recursive)?;
        loop {
            tokio::select! {
                event = rx.recv() => {
                    if event.is_none() { break; }
                    // Let an editor's write-rename-chmod burst settle, then read once.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    while rx.try_recv().is_ok() {}
                    let changed = self.sync();
                    if !changed.is_empty() {
                        on_change(changed);
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: web, namespace: default}\nspec:\n  hosts: [web]\n  http:\n  - route: [{destination: {host: web}}]\n";

    fn source(dir: &Path) -> (FileSource, Arc<RwLock<Store>>) {
        let store = Arc::new(RwLock::new(Store::default()));
        (
            FileSource::new(
                dir.to_path_buf(),
                store.clone(),
                Arc::default(),
                Arc::new(|_| {}),
            ),
            store,
        )
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("meshd-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_rejected_edit_keeps_the_last_good_object() {
        let dir = tempdir("lastgood");
        std::fs::write(dir.join("vs.yaml"), GOOD).unwrap();
        let (mut fs, store) = source(&dir);
        assert_eq!(fs.sync().len(), 1);
        std::fs::write(
            dir.join("vs.yaml"),
            GOOD.replace(
                "route: [{destination: {host: web}}]",
                "route: [{destination: {host: 7}}], timeout: nope",
            ),
        )
        .unwrap();
        assert!(
            fs.sync().is_empty(),
            "nothing may change when the edit is rejected"
        );
        assert_eq!(store.read().unwrap().len(), 1);
        assert!(
            fs.issues.read().unwrap()["vs.yaml"]
                .iter()
                .any(|i| i.level == Level::Error)
        );
    }

    #[test]
    fn a_syntax_error_keeps_the_whole_file_and_deleting_the_file_removes_it() {
        let dir = tempdir("syntax");
        std::fs::write(dir.join("vs.yaml"), GOOD).unwrap();
        let (mut fs, store) = source(&dir);
        fs.sync();
        std::fs::write(dir.join("vs.yaml"), "spec: [unclosed\n").unwrap();
        assert!(fs.sync().is_empty());
        assert_eq!(store.read().unwrap().len(), 1);
        std::fs::remove_file(dir.join("vs.yaml")).unwrap();
        assert_eq!(fs.sync().len(), 1);
        assert!(store.read().unwrap().is_empty());
    }
}
