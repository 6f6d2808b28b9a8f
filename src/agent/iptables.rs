//! `meshd agent iptables`: the injected `istio-init` container's traffic capture, the rules
//! Istio's `istio-iptables` writes (same flags, same chains, same order): outbound TCP to
//! the proxy's port 15001 (`ISTIO_REDIRECT`), inbound TCP to 15006 (`ISTIO_IN_REDIRECT`),
//! the proxy's own traffic (its uid and gid, 1337) left alone, and the HBONE port 15008
//! never captured. The rules go to `iptables-restore --noflush` as one transaction, or to
//! standard output with `--dry-run`. IPv4 with REDIRECT; TPROXY and DNS capture are refused.

use std::io::Write;
use std::process::{Command, Stdio};

/// istio-iptables' flags (the short ones are what the injector writes).
#[derive(clap::Args, Clone, Debug)]
pub struct IptablesArgs {
    /// The proxy's outbound port.
    #[arg(short = 'p', long = "envoy-port", default_value = "15001")]
    pub proxy_port: String,
    /// The proxy's inbound capture port.
    #[arg(short = 'z', long = "inbound-capture-port", default_value = "15006")]
    pub inbound_port: String,
    /// The HBONE tunnel port, never captured.
    #[arg(short = 'e', long = "inbound-tunnel-port", default_value = "15008")]
    pub tunnel_port: String,
    /// The proxy's user ids (comma-separated); their traffic is not captured.
    #[arg(short = 'u', long = "proxy-uid", default_value = "1337")]
    pub proxy_uid: String,
    /// The proxy's group ids; the user ids when unset.
    #[arg(short = 'g', long = "proxy-gid")]
    pub proxy_gid: Option<String>,
    /// `REDIRECT` (`TPROXY` is not supported yet).
    #[arg(
        short = 'm',
        long = "istio-inbound-interception-mode",
        default_value = "REDIRECT"
    )]
    pub mode: String,
    /// Outbound destinations captured: `*`, CIDRs, or none.
    #[arg(short = 'i', long = "istio-service-cidr", default_value = "")]
    pub include_ranges: String,
    /// Outbound destinations never captured (CIDRs).
    #[arg(short = 'x', long = "istio-service-exclude-cidr", default_value = "")]
    pub exclude_ranges: String,
    /// Inbound ports captured: `*`, a list, or none.
    #[arg(short = 'b', long = "istio-inbound-ports", default_value = "")]
    pub include_inbound: String,
    /// Inbound ports never captured (with `-b '*'`).
    #[arg(short = 'd', long = "istio-local-exclude-ports", default_value = "")]
    pub exclude_inbound: String,
    /// Outbound ports captured whatever their destination.
    #[arg(short = 'q', long = "istio-local-outbound-ports", default_value = "")]
    pub include_outbound_ports: String,
    /// Outbound ports never captured.
    #[arg(
        short = 'o',
        long = "istio-local-outbound-ports-exclude",
        default_value = ""
    )]
    pub exclude_outbound_ports: String,
    /// Interfaces whose inbound traffic is treated as outbound (virtual machines' interfaces).
    #[arg(short = 'k', long = "kube-virt-interfaces", default_value = "")]
    pub virtual_interfaces: String,
    /// Interfaces left alone entirely.
    #[arg(short = 'c', long = "exclude-interfaces", default_value = "")]
    pub exclude_interfaces: String,
    /// The loopback range the host uses.
    #[arg(long = "host-ipv4-loopback-cidr", default_value = "127.0.0.1/32")]
    pub loopback: String,
    /// Print the rules instead of applying them.
    #[arg(short = 'n', long)]
    pub dry_run: bool,
    /// Accepted for istio-iptables' compatibility (logging goes to standard error).
    #[arg(long = "log_output_level", default_value = "default:info")]
    pub log_output_level: String,
}

/// Rules that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    #[error("interception mode {0:?} is not supported (REDIRECT is)")]
    Mode(String),
    #[error("{flag}: {value:?} is not an IPv4 CIDR")]
    Cidr { flag: &'static str, value: String },
    #[error("-x: '*' would exclude every destination")]
    ExcludeAll,
    #[error("running iptables-restore: {0}")]
    Restore(String),
}

const INBOUND: &str = "ISTIO_INBOUND";
const REDIRECT: &str = "ISTIO_REDIRECT";
const IN_REDIRECT: &str = "ISTIO_IN_REDIRECT";
const OUTPUT: &str = "ISTIO_OUTPUT";

fn split(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// IPv4 CIDRs of a list (a bare address is a /32); IPv6 ones are left to ip6tables.
fn cidrs(flag: &'static str, list: &str) -> Result<Vec<String>, IptablesError> {
    let mut out = Vec::new();
    for item in split(list) {
        let (address, prefix) = item.split_once('/').unwrap_or((item, "32"));
        if address.contains(':') {
            continue;
        }
        let bad = || IptablesError::Cidr {
            flag,
            value: item.to_string(),
        };
        let ip: std::net::Ipv4Addr = address.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?;
        // The network address, as Go's net.IPNet prints it.
        let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let network = std::net::Ipv4Addr::from(u32::from(ip) & mask);
        out.push(format!("{network}/{prefix}"));
    }
    Ok(out)
}

/// The `iptables-restore` input istio-iptables writes for `args` (IPv4).
pub fn rules(args: &IptablesArgs) -> Result<String, IptablesError> {
    if args.mode != "REDIRECT" {
        return Err(IptablesError::Mode(args.mode.clone()));
    }
    if args.exclude_ranges.trim() == "*" {
        return Err(IptablesError::ExcludeAll);
    }
    let exclude = cidrs("-x", &args.exclude_ranges)?;
    let include_all = args.include_ranges.trim() == "*";
    let include = if include_all {
        Vec::new()
    } else {
        cidrs("-i", &args.include_ranges)?
    };
    let loopback_included = include.iter().any(|c| c.starts_with("127."));
    let mut r: Vec<String> = Vec::new();
    let mut add = |rule: String| r.push(rule);

    for nic in split(&args.exclude_interfaces) {
        add(format!("-A PREROUTING -i {nic} -j RETURN"));
        add(format!("-A OUTPUT -o {nic} -j RETURN"));
    }
    for nic in split(&args.virtual_interfaces) {
        add(format!("-I PREROUTING 1 -i {nic} -j RETURN"));
    }
    add(format!(
        "-A {INBOUND} -p tcp --dport {} -j RETURN",
        args.tunnel_port
    ));
    add(format!(
        "-A {REDIRECT} -p tcp -j REDIRECT --to-ports {}",
        args.proxy_port
    ));
    add(format!(
        "-A {IN_REDIRECT} -p tcp -j REDIRECT --to-ports {}",
        args.inbound_port
    ));
    match args.include_inbound.trim() {
        "" => {}
        "*" => {
            add(format!("-A PREROUTING -p tcp -j {INBOUND}"));
            for port in split(&args.exclude_inbound) {
                add(format!("-A {INBOUND} -p tcp --dport {port} -j RETURN"));
            }
            add(format!("-A {INBOUND} -p tcp -j {IN_REDIRECT}"));
        }
        ports => {
            add(format!("-A PREROUTING -p tcp -j {INBOUND}"));
            for port in split(ports) {
                add(format!(
                    "-A {INBOUND} -p tcp --dport {port} -j {IN_REDIRECT}"
                ));
            }
        }
    }
    add(format!("-A OUTPUT -j {OUTPUT}"));
    for port in split(&args.exclude_outbound_ports) {
        add(format!("-A {OUTPUT} -p tcp --dport {port} -j RETURN"));
        add(format!("-A {OUTPUT} -p udp --dport {port} -j RETURN"));
    }
    add(format!("-A {OUTPUT} -o lo -s 127.0.0.6/32 -j RETURN"));
    let gids = args
        .proxy_gid
        .clone()
        .unwrap_or_else(|| args.proxy_uid.clone());
    for (owner, ids) in [("--uid-owner", &args.proxy_uid), ("--gid-owner", &gids)] {
        for id in split(ids) {
            // The proxy calling its own workload through the loopback goes to the inbound side.
            add(format!(
                "-A {OUTPUT} -o lo ! -d {} -p tcp ! --dport {} -m owner {owner} {id} -j {IN_REDIRECT}",
                args.loopback, args.tunnel_port
            ));
            if !loopback_included {
                add(format!(
                    "-A {OUTPUT} -o lo -m owner ! {owner} {id} -j RETURN"
                ));
            }
            add(format!("-A {OUTPUT} -m owner {owner} {id} -j RETURN"));
        }
    }
    add(format!("-A {OUTPUT} -d {} -j RETURN", args.loopback));
    for cidr in &exclude {
        add(format!("-A {OUTPUT} -d {cidr} -j RETURN"));
    }
    for port in split(&args.include_outbound_ports) {
        add(format!("-A {OUTPUT} -p tcp --dport {port} -j {REDIRECT}"));
    }
    if include_all {
        add(format!("-A {OUTPUT} -j {REDIRECT}"));
        for nic in split(&args.virtual_interfaces) {
            add(format!("-I PREROUTING 1 -i {nic} -j {REDIRECT}"));
        }
    } else {
        for cidr in &include {
            for nic in split(&args.virtual_interfaces) {
                add(format!("-I PREROUTING 1 -i {nic} -d {cidr} -j {REDIRECT}"));
            }
            add(format!("-A {OUTPUT} -d {cidr} -j {REDIRECT}"));
        }
    }

    // Istio's chains, made before any rule, in the order the rules first name them.
    let mut chains: Vec<&str> = Vec::new();
    for rule in &r {
        for word in rule.split(' ') {
            if word.starts_with("ISTIO_") && !chains.contains(&word) {
                chains.push(word);
            }
        }
    }
    let mut out = String::from("* nat\n");
    for chain in chains {
        out.push_str(&format!("-N {chain}\n"));
    }
    for rule in &r {
        out.push_str(rule);
        out.push('\n');
    }
    out.push_str("COMMIT\n");
    Ok(out)
}

/// Writes the rules (or prints them with `--dry-run`).
pub fn run(args: &IptablesArgs) -> Result<(), IptablesError> {
    let text = rules(args)?;
    if args.dry_run {
        print!("{text}");
        return Ok(());
    }
    eprintln!("meshd agent iptables: applying\n{text}");
    let mut child = Command::new("iptables-restore")
        .arg("--noflush")
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| IptablesError::Restore(format!("iptables-restore could not start: {e}")))?;
    let written = child
        .stdin
        .take()
        .map(|mut stdin| stdin.write_all(text.as_bytes()));
    let status = child
        .wait()
        .map_err(|e| IptablesError::Restore(e.to_string()))?;
    if let Some(Err(e)) = written {
        return Err(IptablesError::Restore(format!("writing the rules: {e}")));
    }
    if !status.success() {
        return Err(IptablesError::Restore(format!(
            "iptables-restore failed: {status}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: IptablesArgs,
    }

    fn args(flags: &[&str]) -> IptablesArgs {
        Cli::parse_from([&["iptables"], flags].concat()).args
    }

    #[test]
    fn what_cannot_be_captured_is_refused_naming_the_flag() {
        let e = rules(&args(&["-m", "TPROXY"])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "interception mode \"TPROXY\" is not supported (REDIRECT is)"
        );
        let e = rules(&args(&["-i", "10.0.0.0/33"])).unwrap_err();
        assert_eq!(e.to_string(), "-i: \"10.0.0.0/33\" is not an IPv4 CIDR");
        let e = rules(&args(&["-x", "*"])).unwrap_err();
        assert_eq!(e.to_string(), "-x: '*' would exclude every destination");
    }

    #[test]
    fn excluded_destinations_and_ports_return_before_the_capture() {
        let text = rules(&args(&[
            "-i",
            "*",
            "-x",
            "10.1.2.3,192.168.0.0/16",
            "-o",
            "5432",
        ]))
        .unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let at = |rule: &str| {
            lines
                .iter()
                .position(|l| *l == rule)
                .unwrap_or_else(|| panic!("{rule} in\n{text}"))
        };
        let capture = at("-A ISTIO_OUTPUT -j ISTIO_REDIRECT");
        assert!(at("-A ISTIO_OUTPUT -d 10.1.2.3/32 -j RETURN") < capture);
        assert!(at("-A ISTIO_OUTPUT -d 192.168.0.0/16 -j RETURN") < capture);
        assert!(
            at("-A ISTIO_OUTPUT -p tcp --dport 5432 -j RETURN")
                < at("-A ISTIO_OUTPUT -o lo -s 127.0.0.6/32 -j RETURN")
        );
        // IPv6 ranges are ip6tables' and left out here.
        let v6 = rules(&args(&["-i", "2001:db8::/32"])).unwrap();
        assert!(!v6.contains("2001"), "{v6}");
    }
}
