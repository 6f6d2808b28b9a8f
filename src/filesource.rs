//! The config-directory source: loads every `*.yaml`/`*.yml` under a directory, watches it,
//! and applies adds, edits and deletes to the model. After the first load, a burst of
//! file events re-reads only the files it names; the whole directory is read again only
//! when a directory, a symlink swap (a mounted ConfigMap's `..data`) or a lost event may
//! have changed files no event names.
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

use model::Store;
use model::config::parse::{Parsed, parse_file};
use model::config::{ConfigIssue, Level, ObjectKey};

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
            changed.extend(self.remove_file(&path));
        }
        for path in files {
            changed.extend(self.load(&path));
        }
        changed
    }

    /// Re-reads what a burst of file events touched: the YAML files among `paths` (a
    /// file gone is removed), or the whole directory when one of them may stand for
    /// files no event names (a directory; a hidden symlink or directory, as a mounted
    /// ConfigMap swaps its `..data`). Hidden files (an editor's or sync tool's temporary
    /// copies) and other files are not configuration.
    pub fn sync_paths(&mut self, paths: &BTreeSet<PathBuf>) -> BTreeSet<ObjectKey> {
        let yaml =
            |p: &Path| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml"));
        let mut files = Vec::new();
        for path in paths {
            let hidden = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| n.starts_with('.'));
            let config = !hidden && yaml(path);
            let meta = std::fs::symlink_metadata(path).ok();
            // A directory, or a link that is no YAML file (`..data`), may hold files no
            // event names; so may a path that is gone and had tracked files below it.
            let holds_files = meta
                .as_ref()
                .is_some_and(|m| m.is_dir() || (m.file_type().is_symlink() && !config));
            let held_files =
                meta.is_none() && self.files.keys().any(|f| f != path && f.starts_with(path));
            if holds_files || held_files || path == &self.dir {
                return self.sync();
            }
            if config {
                files.push(path);
            }
        }
        let mut changed = BTreeSet::new();
        for path in files {
            if path.is_file() {
                changed.extend(self.load(path));
            } else if self.files.contains_key(path) {
                changed.extend(self.remove_file(path));
            }
        }
        changed
    }

    /// Forgets a file that is gone, and the objects only it defined.
    fn remove_file(&mut self, path: &Path) -> BTreeSet<ObjectKey> {
        let mut changed = BTreeSet::new();
        let state = self.files.remove(path).unwrap_or_default();
        let name = self.display_name(path);
        tracing::info!(file = %name, objects = state.keys.len(), "config file removed");
        self.issues.write().unwrap().remove(&name);
        let mut store = self.store.write().unwrap();
        for key in state.keys {
            if !self.claimed_elsewhere(&key, path) && store.delete(&key) {
                changed.insert(key);
            }
        }
        changed
    }

    /// Reads a file and applies it, unless its content is what was applied last.
    fn load(&mut self, path: &Path) -> BTreeSet<ObjectKey> {
        let Ok(text) = std::fs::read_to_string(path) else {
            tracing::warn!(file = %path.display(), "cannot read config file; keeping its last good objects");
            return BTreeSet::new();
        };
        let hash = xxhash_rust::xxh3::xxh3_64(text.as_bytes());
        if self.files.get(path).is_some_and(|s| s.hash == hash) {
            return BTreeSet::new();
        }
        let name = self.display_name(path);
        let parsed = parse_file(&name, &text);
        self.apply_file(path, hash, parsed)
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
        // Each event's paths; `None` when the watcher may have lost events.
        let (tx, mut rx) = mpsc::unbounded_channel::<Option<Vec<PathBuf>>>();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let paths = match event {
                    Ok(e) if !may_change_content(&e.kind) => return,
                    Ok(e) if !e.need_rescan() && !e.paths.is_empty() => Some(e.paths),
                    _ => None,
                };
                let _ = tx.send(paths);
            })?;
        watcher.watch(&self.dir, RecursiveMode::Recursive)?;
        loop {
            tokio::select! {
                event = rx.recv() => {
                    let Some(first) = event else { break };
                    // Let an editor's write-rename-chmod burst settle, then read once.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let mut paths = BTreeSet::new();
                    let mut everything = false;
                    for event in std::iter::once(first).chain(std::iter::from_fn(|| rx.try_recv().ok())) {
                        match event {
                            Some(p) => paths.extend(p),
                            None => everything = true,
                        }
                    }
                    let changed = if everything { self.sync() } else { self.sync_paths(&paths) };
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

/// Whether a file event may stand for new content. notify's inotify watcher reports every
/// open of a watched file, meshd's own reads included: taken as changes, each read of a
/// file would have it read again, about every 20 ms for as long as meshd runs (and the
/// whole directory, once a full read had opened it). Reads, opens and closes after
/// reading change nothing; a close after writing does.
fn may_change_content(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind};
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
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

    /// A fresh directory, removed when the test is done with it.
    struct TempDir(PathBuf);

    impl std::ops::Deref for TempDir {
        type Target = PathBuf;
        fn deref(&self) -> &PathBuf {
            &self.0
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn tempdir(name: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("meshd-fs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
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

    #[test]
    fn opening_or_reading_a_file_is_no_change() {
        use notify::event::{
            AccessKind, AccessMode, CreateKind, DataChange, EventKind, ModifyKind, RenameMode,
        };
        for quiet in [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ] {
            assert!(!may_change_content(&quiet), "{quiet:?}");
        }
        for change in [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Remove(notify::event::RemoveKind::File),
            EventKind::Any,
            EventKind::Other,
        ] {
            assert!(may_change_content(&change), "{change:?}");
        }
    }

    #[test]
    fn file_events_re_read_only_the_files_they_name() {
        let dir = tempdir("targeted");
        let vs = |name: &str, host: &str| {
            GOOD.replace("name: web", &format!("name: {name}"))
                .replace("hosts: [web]", &format!("hosts: [{host}]"))
        };
        std::fs::write(dir.join("a.yaml"), vs("a", "a1")).unwrap();
        std::fs::write(dir.join("b.yaml"), vs("b", "b1")).unwrap();
        let (mut fs, store) = source(&dir);
        assert_eq!(fs.sync().len(), 2);
        let names =
            |keys: BTreeSet<ObjectKey>| keys.into_iter().map(|k| k.name).collect::<Vec<_>>();
        let named = |files: &[&str]| files.iter().map(|f| dir.join(f)).collect::<BTreeSet<_>>();
        // Both files change on disk; the events name a.yaml, a hidden temporary copy and
        // a file that is no configuration. b's edit stays unread.
        std::fs::write(dir.join("a.yaml"), vs("a", "a2")).unwrap();
        std::fs::write(dir.join("b.yaml"), vs("b", "b2")).unwrap();
        std::fs::write(dir.join(".a.yaml.tmp"), "spec: [unclosed").unwrap();
        std::fs::write(dir.join("notes.txt"), "hello").unwrap();
        let changed = fs.sync_paths(&named(&["a.yaml", ".a.yaml.tmp", "notes.txt"]));
        assert_eq!(names(changed), ["a"]);
        let hosts = |store: &Arc<RwLock<Store>>| {
            let mut h: Vec<String> = store
                .read()
                .unwrap()
                .iter()
                .map(|o| match &o.spec {
                    model::config::Spec::VirtualService(vs) => vs.hosts[0].clone(),
                    other => panic!("{other:?}"),
                })
                .collect();
            h.sort();
            h
        };
        assert_eq!(hosts(&store), ["a2", "b1"]);
        // A file gone: its objects go.
        std::fs::remove_file(dir.join("a.yaml")).unwrap();
        assert_eq!(names(fs.sync_paths(&named(&["a.yaml"]))), ["a"]);
        assert_eq!(hosts(&store), ["b1"]);
        // A new directory may hold files no event names: the whole directory is read.
        std::fs::create_dir(dir.join("more")).unwrap();
        std::fs::write(dir.join("more/c.yaml"), vs("c", "c1")).unwrap();
        assert_eq!(names(fs.sync_paths(&named(&["more"]))), ["b", "c"]);
        assert_eq!(hosts(&store), ["b2", "c1"]);
        // So may a mounted ConfigMap's swapped `..data` link.
        std::fs::create_dir(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v2/d.yaml"), vs("d", "d1")).unwrap();
        std::os::unix::fs::symlink("..v2", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/d.yaml", dir.join("d.yaml")).unwrap();
        assert_eq!(names(fs.sync_paths(&named(&["..data"]))), ["d"]);
        assert_eq!(hosts(&store), ["b2", "c1", "d1"]);
    }
}
