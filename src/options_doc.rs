//! docs/configuration.md's table of command-line flags is rendered from the commands'
//! own definitions, and a test holds the committed table equal to them
//! (`MESHD_UPDATE_GOLDEN=1 cargo test --features loadgen` rewrites it; without the feature
//! the simulator's rows are left out of the comparison).

use clap::CommandFactory;

use super::Cli;

const BEGIN: &str = "<!-- flags: generated from the commands' definitions -->";
const END: &str = "<!-- end of flags -->";

/// One row per flag of every command: command, flag, environment variable, default, and
/// what it does.
fn flags_table() -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::from("| Command | Flag | Environment | Default | What it does |\n");
    out.push_str("|---|---|---|---|---|\n");
    let root = Cli::command();
    // Each command, and each command's own subcommands (`agent iptables`).
    let commands = root.get_subcommands().flat_map(|c| {
        let nested = c
            .get_subcommands()
            .map(move |s| (format!("{} {}", c.get_name(), s.get_name()), s));
        std::iter::once((c.get_name().to_string(), c)).chain(nested)
    });
    for (name, command) in commands {
        for arg in command.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" {
                continue;
            }
            let env = arg
                .get_env()
                .map(|e| format!("`{}`", e.to_string_lossy()))
                .unwrap_or_default();
            let default: Vec<String> = (arg.get_default_values().iter())
                .map(|v| v.to_string_lossy().into_owned())
                .collect();
            let default = match default.join(",") {
                d if d.is_empty() => String::new(),
                d => format!("`{d}`"),
            };
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            out.push_str(&format!(
                "| `{name}` | `--{long}` | {env} | {default} | {} |\n",
                cell(&help)
            ));
        }
    }
    out
}

#[test]
fn the_configuration_reference_lists_every_flag_as_defined() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let text = std::fs::read_to_string(&path).expect("docs/configuration.md");
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        panic!("docs/configuration.md lacks the markers {BEGIN:?} and {END:?}");
    };
    let mut committed = text[begin + BEGIN.len()..end].to_string();
    if !cfg!(feature = "loadgen") {
        committed = (committed.split_inclusive('\n'))
            .filter(|row| !row.starts_with("| `loadgen` |"))
            .collect();
    }
    let table = format!("\n{}", flags_table());
    if std::env::var_os("MESHD_UPDATE_GOLDEN").is_some() {
        if !cfg!(feature = "loadgen") {
            panic!("the table covers `meshd loadgen`: update it with `--features loadgen`");
        }
        let updated = format!("{}{table}{}", &text[..begin + BEGIN.len()], &text[end..]);
        std::fs::write(&path, updated).unwrap();
        return;
    }
    assert!(
        committed == table,
        "docs/configuration.md's flags drifted from the commands: run MESHD_UPDATE_GOLDEN=1 cargo test --features loadgen and commit"
    );
}
