use super::super::parse::parse_file;

#[test]
fn delegate_virtual_services_hold_http_routes_only_and_roots_only_delegate() {
    let errors = |spec: &str| {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n{spec}"
        );
        let parsed = parse_file("vs.yaml", &yaml);
        (parsed.errors())
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
    };
    let route = "route: [{destination: {host: reviews}}]";
    assert_eq!(
        errors(&format!("  http: [{{{route}}}]\n")),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(&format!(
            "  gateways: [web]\n  tcp: [{{{route}}}]\n  http: [{{delegate: {{name: x}}}}]\n"
        )),
        [
            "spec.gateways: must be empty in a delegate VirtualService (one without hosts)",
            "spec.tcp: must be empty in a delegate VirtualService (one without hosts)",
            "spec.http[0].delegate: a delegate VirtualService cannot delegate again",
        ]
    );
    assert_eq!(
        errors("  hosts: [reviews]\n  http: [{delegate: {namespace: team}}]\n"),
        ["spec.http[0].delegate.name: is required"]
    );
    assert_eq!(
        errors(&format!(
            "  hosts: [reviews]\n  http: [{{delegate: {{name: x}}, {route}}}]\n"
        )),
        ["spec.http[0]: a route with a delegate must not specify route or redirect"]
    );
}

#[test]
fn only_allow_and_deny_policies_may_be_a_dry_run() {
    let issues = |kind: &str, dry: &str, spec: &str| {
        let yaml = format!(
            "apiVersion: {kind}\nmetadata: {{name: p, namespace: shop, annotations: {{istio.io/dry-run: '{dry}'}}}}\nspec:\n{spec}"
        );
        (parse_file("x.yaml", &yaml).issues.iter())
            .map(|e| format!("{:?} {}: {}", e.level, e.field, e.message))
            .collect::<Vec<_>>()
    };
    let ap = "security.istio.io/v1\nkind: AuthorizationPolicy";
    assert!(issues(ap, "true", "  action: DENY\n  rules: [{}]\n").is_empty());
    assert!(issues(ap, "False", "  rules: [{}]\n").is_empty());
    assert_eq!(
        issues(ap, "yes", "  action: DENY\n  rules: [{}]\n"),
        ["Error metadata.annotations[istio.io/dry-run]: \"yes\" is not a boolean"]
    );
    assert_eq!(
        issues(ap, "true", "  action: AUDIT\n  rules: [{}]\n"),
        [
            "Error metadata.annotations[istio.io/dry-run]: only ALLOW and DENY policies can be a dry run (not AUDIT or CUSTOM)"
        ]
    );
    assert_eq!(
        issues(
            "networking.istio.io/v1\nkind: VirtualService",
            "true",
            "  hosts: [a]\n"
        ),
        [
            "Error metadata.annotations[istio.io/dry-run]: only an AuthorizationPolicy supports it; remove the annotation"
        ]
    );
    let yaml = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: invalid-gateway, namespace: istio-system, annotations: {istio.io/alwaysReject: 'true'}}\nspec: {}\n";
    let refused: Vec<String> = (parse_file("x.yaml", yaml).issues.iter())
        .map(|e| e.field.clone())
        .collect();
    assert!(
        refused.contains(&"metadata.annotations[istio.io/alwaysReject]".to_string()),
        "{refused:?}"
    );
}

#[test]
fn custom_policies_name_a_provider_and_the_mesh_config_warns_about_bad_ones() {
    let issues = |yaml: &str| {
        (parse_file("x.yaml", yaml).issues.iter())
            .map(|e| format!("{:?} {}: {}", e.level, e.field, e.message))
            .collect::<Vec<_>>()
    };
    let policy = |spec: &str| {
        issues(&format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: shop}}\nspec:\n{spec}"
        ))
    };
    assert_eq!(
        policy("  action: CUSTOM\n  provider: {name: opa}\n  rules: [{}]\n"),
        Vec::<String>::new()
    );
    assert_eq!(
        policy("  action: CUSTOM\n  rules: [{}]\n"),
        ["Error spec.provider: must specify provider when using CUSTOM action"]
    );
    assert_eq!(
        policy("  action: DENY\n  provider: {name: opa}\n  rules: [{}]\n"),
        ["Error spec.provider: provider must only be specified when using CUSTOM action"]
    );
    let mesh = |providers: &str| {
        issues(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    extensionProviders:\n{providers}"
        ))
    };
    let http = |name: &str, rest: &str| {
        format!(
            "    - name: {name}\n      envoyExtAuthzHttp: {{service: authz.shop.svc.cluster.local, port: 8000{rest}}}\n"
        )
    };
    assert_eq!(
        mesh(&format!(
            "{}{}    - name: zipkin\n      zipkin: {{service: zipkin.istio-system.svc.cluster.local, port: 9411}}\n",
            http("opa", ", statusOnError: '503', timeout: 2s"),
            "    - name: grpc\n      envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 9000}\n"
        )),
        Vec::<String>::new()
    );
    assert_eq!(
        mesh(&format!(
            "{}{}{}{}{}",
            http("Opa", ""),
            http("a", ", pathPrefix: check"),
            http("b", ", statusOnError: '999'"),
            http("c", ", includeRequestHeadersInCheck: ['*']"),
            "    - name: d\n      envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 0}\n"
        )),
        [
            "Warning data.mesh.extensionProviders[0]: invalid provider name \"Opa\": lowercase letters, digits and hyphens, at most 63, not starting or ending with a hyphen",
            "Warning data.mesh.extensionProviders[1]: pathPrefix must begin with `/`, found: \"check\"",
            "Warning data.mesh.extensionProviders[2]: unsupported statusOnError 999",
            "Warning data.mesh.extensionProviders[3]: a single wildcard (\"*\") is not supported, change it to either prefix or suffix match: includeRequestHeadersInCheck",
            "Warning data.mesh.extensionProviders[4]: port must be in the range [1, 65535], found: 0",
        ]
    );
}

#[test]
fn export_to_names_namespaces_once_and_a_selecting_rule_stays_home() {
    let errors = |kind: &str, spec: &str| {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: {kind}\nmetadata: {{name: r, namespace: shop}}\nspec:\n{spec}"
        );
        let parsed = parse_file("x.yaml", &yaml);
        (parsed.errors())
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
    };
    let dr = |rest: &str| errors("DestinationRule", &format!("  host: reviews\n{rest}"));
    assert_eq!(dr("  exportTo: ['.', billing]\n"), Vec::<String>::new());
    assert_eq!(
        dr("  exportTo: ['.', shop, Billing, '*', '~']\n"),
        [
            "spec.exportTo[1]: duplicate entry \"shop\" (. is namespace \"shop\")",
            "spec.exportTo[2]: \"Billing\" is not ., * or a namespace name",
            "spec.exportTo[4]: \"~\" is not ., * or a namespace name",
            "spec.exportTo: * and ~ cannot be combined with other entries",
        ]
    );
    let selecting = "  workloadSelector: {matchLabels: {app: a}}\n";
    assert_eq!(
        dr(&format!("{selecting}  exportTo: [shop]\n")),
        Vec::<String>::new()
    );
    assert_eq!(
        dr(&format!("{selecting}  exportTo: ['*']\n")),
        [
            "spec.exportTo: a DestinationRule with a workloadSelector cannot be exported beyond its namespace"
        ]
    );
    let se = "  hosts: [api.example.com]\n  ports: [{number: 443, name: tls, protocol: TLS}]\n";
    assert_eq!(
        errors("ServiceEntry", &format!("{se}  exportTo: ['~']\n")),
        Vec::<String>::new()
    );
    assert_eq!(
        errors(
            "VirtualService",
            "  hosts: [reviews]\n  exportTo: [-shop]\n"
        ),
        ["spec.exportTo[0]: \"-shop\" is not ., * or a namespace name"]
    );
}

#[test]
fn a_traffic_policy_needs_durations_that_parse_and_percentages() {
    let parsed = parse_file(
        "dr.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    connectionPool: {tcp: {connectTimeout: soon, maxConnections: -1}, http: {idleTimeout: 5x}}\n    outlierDetection: {interval: 10s, baseEjectionTime: -1s, maxEjectionPercent: 120}\n  subsets:\n  - name: v1\n    trafficPolicy: {outlierDetection: {minHealthPercent: -5}}\n",
    );
    assert!(parsed.objects.is_empty(), "the DestinationRule is rejected");
    let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.trafficPolicy.connectionPool.tcp.connectTimeout",
            "spec.trafficPolicy.connectionPool.tcp.maxConnections",
            "spec.trafficPolicy.connectionPool.http.idleTimeout",
            "spec.trafficPolicy.outlierDetection.baseEjectionTime",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
            "spec.subsets[0].trafficPolicy.outlierDetection.minHealthPercent",
        ]
    );
}

#[test]
fn port_level_settings_and_consistent_hashes_are_checked_with_their_fields() {
    let parsed = parse_file(
        "dr.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {consistentHash: {httpHeaderName: x-user, useSourceIp: true, maglev: {tableSize: 65536}}}\n    portLevelSettings:\n    - port: {number: 9080}\n      connectionPool: {tcp: {tcpKeepalive: {time: often}}}\n    - loadBalancer: {consistentHash: {httpCookie: {ttl: 1h}}}\n    - port: {number: 70000}\n  subsets:\n  - name: v1\n    trafficPolicy: {connectionPool: {http: {h2UpgradePolicy: UPGRADE, useClientProtocol: true, maxConcurrentStreams: -1}}}\n",
    );
    assert!(parsed.objects.is_empty(), "the DestinationRule is rejected");
    let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
    let p = "spec.trafficPolicy";
    assert_eq!(
        fields,
        [
            format!("{p}.loadBalancer.consistentHash"),
            format!("{p}.loadBalancer.consistentHash.maglev.tableSize"),
            format!("{p}.portLevelSettings[0].connectionPool.tcp.tcpKeepalive.time"),
            format!("{p}.portLevelSettings[1].port"),
            format!("{p}.portLevelSettings[1].loadBalancer.consistentHash.httpCookie.name"),
            format!("{p}.portLevelSettings[2].port.number"),
            format!("{p}.portLevelSettings[2]"),
            "spec.subsets[0].trafficPolicy.connectionPool.http.maxConcurrentStreams".into(),
            "spec.subsets[0].trafficPolicy.connectionPool.http.useClientProtocol".into(),
        ]
    );
    let good = parse_file(
        "dr.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer: {consistentHash: {httpCookie: {name: user, ttl: 1h}, maglev: {tableSize: 65537}}}\n    portLevelSettings:\n    - port: {number: 9080}\n      connectionPool: {tcp: {tcpKeepalive: {time: 7200s, interval: 75s, probes: 9}}}\n",
    );
    assert!(good.errors().next().is_none(), "{:?}", good.issues);
    assert_eq!(good.objects.len(), 1);
}

#[test]
fn tcp_routes_need_hosts_and_weights_summing_to_100() {
    let vs = |tcp: &str| {
        parse_file(
            "vs.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db]\n  tcp:\n{tcp}"
            ),
        )
    };
    let bad = vs(
        "  - route: [{destination: {host: db, subset: v1}, weight: 60}, {destination: {host: ''}, weight: 30}]\n  - route: []\n",
    );
    assert!(bad.objects.is_empty());
    let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.tcp[0].route[1].destination.host",
            "spec.tcp[0].route",
            "spec.tcp[1].route"
        ]
    );
    let good = vs(
        "  - match: [{port: 27017, destinationSubnets: [10.1.0.0/16]}]\n    route: [{destination: {host: db}}]\n",
    );
    assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
    assert!(good.issues.is_empty(), "{:?}", good.issues);
    // Gateways ignore subnets: a match bound only to one warns.
    let at_gateway = vs(
        "  - match: [{port: 27017, gateways: [edge], destinationSubnets: [10.1.0.0/16]}, {gateways: [mesh], destinationSubnets: [10.2.0.0/16]}]\n    route: [{destination: {host: db}}]\n",
    );
    assert_eq!(at_gateway.objects.len(), 1, "{:?}", at_gateway.issues);
    let warned: Vec<&str> = at_gateway.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(warned, ["spec.tcp[0].match[0].destinationSubnets[0]"]);
    // A slash without a length is no CIDR.
    let slash = vs(
        "  - match: [{port: 27017, destinationSubnets: ['10.1.0.0/']}]\n    route: [{destination: {host: db}}]\n",
    );
    let fields: Vec<&str> = slash.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(fields, ["spec.tcp[0].match[0].destinationSubnets[0]"]);
}

#[test]
fn faults_mirrors_and_cors_are_checked_as_istio_checks_them() {
    let vs = |http: &str| {
        parse_file(
            "vs.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n  hosts: [ratings]\n  http:\n{http}"
            ),
        )
    };
    let bad = vs(concat!(
        "  - route: [{destination: {host: ratings}}]\n    fault: {}\n",
        "  - route: [{destination: {host: ratings}}]\n",
        "    fault: {delay: {percentage: {value: 101}}, abort: {httpStatus: 700}}\n",
        "  - route: [{destination: {host: ratings}}]\n",
        "    fault: {delay: {fixedDelay: soon, percent: 200}, abort: {grpcStatus: SLOW}}\n",
        "  - route: [{destination: {host: ratings}}]\n    fault: {abort: {percentage: {value: 5}}}\n",
        "  - route: [{destination: {host: ratings}}]\n    mirror: {host: a}\n    mirrors: [{destination: {host: ''}, percentage: {value: -1}}]\n",
        "  - route: [{destination: {host: ratings}}]\n    corsPolicy: {allowOrigins: [{regex: '(a'}], maxAge: long, unmatchedPreflights: DROP}\n",
    ));
    assert!(bad.objects.is_empty());
    let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.http[0].fault",
            "spec.http[1].fault.delay.fixedDelay",
            "spec.http[1].fault.delay.percentage.value",
            "spec.http[1].fault.abort.httpStatus",
            "spec.http[2].fault.delay.fixedDelay",
            "spec.http[2].fault.delay.percent",
            "spec.http[2].fault.abort.grpcStatus",
            "spec.http[3].fault.abort",
            "spec.http[4].mirrors",
            "spec.http[4].mirrors[0].destination.host",
            "spec.http[4].mirrors[0].percentage.value",
            "spec.http[5].corsPolicy.allowOrigins[0].regex",
            "spec.http[5].corsPolicy.maxAge",
            "spec.http[5].corsPolicy.unmatchedPreflights",
        ]
    );
    let good = vs(concat!(
        "  - route: [{destination: {host: ratings}}]\n",
        "    fault: {delay: {fixedDelay: 7s, percentage: {value: 12.5}}, abort: {grpcStatus: UNAVAILABLE}}\n",
        "  - route: [{destination: {host: ratings}}]\n",
        "    fault: {delay: {exponentialDelay: 1s}, abort: {http2Error: CANCEL}}\n",
        "    mirror: {host: ratings-copy}\n    corsPolicy: {allowOrigins: [{exact: '*'}]}\n",
    ));
    assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
    let warned: Vec<&str> = good.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(
        warned,
        [
            "spec.http[1].fault.delay.exponentialDelay",
            "spec.http[1].fault.abort.http2Error",
        ]
    );
}

#[test]
fn a_regex_rewrite_needs_a_regex_envoy_compiles() {
    let vs = |rewrite: &str| {
        parse_file(
            "vs.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n  hosts: [ratings]\n  http:\n  - route: [{{destination: {{host: ratings}}}}]\n    rewrite: {rewrite}\n"
            ),
        )
    };
    let fields =
        |rewrite: &str| -> Vec<String> { vs(rewrite).errors().map(|e| e.field.clone()).collect() };
    let f = "spec.http[0].rewrite.uriRegexRewrite.match";
    assert_eq!(
        fields("{uriRegexRewrite: {match: '(?=x)', rewrite: /}}"),
        [f]
    );
    assert_eq!(fields("{uriRegexRewrite: {rewrite: /}}"), [f]);
    assert_eq!(
        fields("{uri: /a, uriRegexRewrite: {match: '^/b', rewrite: /}}"),
        ["spec.http[0].rewrite"]
    );
    assert_eq!(
        vs("{uriRegexRewrite: {match: '^/b/(.*)', rewrite: '/\\1'}}")
            .objects
            .len(),
        1
    );
}

#[test]
fn sidecar_egress_listeners_are_checked_as_istio_checks_them() {
    let sc = |egress: &str| {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: s, namespace: shop}}\nspec:\n  egress:\n{egress}"
        );
        let files = parse_file("sc.yaml", &yaml);
        let levels = |level| {
            (files.issues.iter())
                .filter(|i| i.level == level)
                .map(|i| i.field.clone())
                .collect::<Vec<_>>()
        };
        (
            levels(super::super::Level::Error),
            levels(super::super::Level::Warning),
        )
    };
    let good = "  - {port: {number: 9080, protocol: HTTP, name: web}, bind: 127.0.0.2, captureMode: NONE, hosts: [./reviews]}\n  - {port: {number: 3306, protocol: MySQL}, hosts: [db/*]}\n  - {port: {number: 8081}, hosts: [./*]}\n  - {hosts: ['istio-system/*']}\n";
    assert_eq!(sc(good), (vec![], vec![]));
    let (errors, _) = sc(
        "  - {hosts: ['*/*']}\n  - {port: {number: 9080, protocol: FTP}, bind: localhost, captureMode: SOMETIMES, hosts: [reviews]}\n  - {port: {number: 9080, protocol: HTTP}, hosts: []}\n  - {port: {number: 0, protocol: HTTP}, hosts: [./*]}\n",
    );
    assert_eq!(
        errors,
        [
            "spec.egress[0].port",
            "spec.egress[1].hosts[0]",
            "spec.egress[1].captureMode",
            "spec.egress[1].bind",
            "spec.egress[1].port.protocol",
            "spec.egress[2].hosts",
            "spec.egress[2].port.number",
            "spec.egress[3].port.number",
        ]
    );
    let (errors, warnings) = sc(
        "  - {port: {number: 0, protocol: HTTP}, bind: 'unix:///var/run/app.sock', hosts: [./*]}\n  - {port: {number: 8080, protocol: HTTP_PROXY}, hosts: [./*]}\n",
    );
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(
        warnings,
        ["spec.egress[0].bind", "spec.egress[1].port.protocol"]
    );
}

#[test]
fn gateway_tls_and_sidecar_fields_meshd_does_not_serve_warn() {
    let gw = parse_file(
        "gw.yaml",
        concat!(
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n",
            "  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE, credentialName: c}}\n",
            "  - {port: {number: 444, name: b, protocol: TLS}, hosts: ['*'], tls: {}}\n",
            "  - {port: {number: 445, name: c, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE, serverCertificate: /c.pem, privateKey: /k.pem}}\n",
            "  - {port: {number: 446, name: d, protocol: TLS}, hosts: ['*'], tls: {mode: ISTIO_MUTUAL}}\n",
            "  - {port: {number: 447, name: e, protocol: TLS}, hosts: ['*'], tls: {mode: AUTO_PASSTHROUGH}}\n",
            "  - {port: {number: 448, name: f, protocol: HTTPS}, hosts: ['*'], tls: {mode: AUTO_PASSTHROUGH}}\n",
        ),
    );
    assert_eq!(gw.objects.len(), 1, "{:?}", gw.issues);
    let warned: Vec<&str> = gw.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(warned, ["spec.servers[5].tls.mode"]);
    let files = parse_file(
        "gw.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: MUTUAL, serverCertificate: /c.pem}}\n",
    );
    let errors: Vec<&str> = files.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errors,
        [
            "spec.servers[0].tls.privateKey",
            "spec.servers[0].tls.caCertificates"
        ]
    );
    let istio_mutual = parse_file(
        "gw.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: shop}\nspec:\n  servers:\n  - {port: {number: 443, name: a, protocol: HTTPS}, hosts: ['*'], tls: {mode: ISTIO_MUTUAL, credentialName: c}}\n",
    );
    let errors: Vec<&str> = istio_mutual.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(errors, ["spec.servers[0].tls.credentialName"]);
    let sc = parse_file(
        "sc.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  inboundConnectionPool: {http: {http1MaxPendingRequests: 1}}\n  outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: egress.shop.svc.cluster.local, port: {number: 80}}}\n  ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: '127.0.0.1:8080', tls: {mode: SIMPLE}}]\n  egress: [{port: {number: 9080, protocol: HTTP, name: http}, hosts: [./reviews]}, {hosts: ['istio-system/*']}]\n",
    );
    assert_eq!(sc.objects.len(), 1, "{:?}", sc.issues);
    let warned: Vec<&str> = sc.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(warned, ["spec.ingress[0].tls"]);
    // An egress proxy needs ALLOW_ANY, a DNS host and a port.
    let bad_proxy = parse_file(
        "sc.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  outboundTrafficPolicy: {mode: REGISTRY_ONLY, egressProxy: {host: 'egress gw'}}\n",
    );
    let errors: Vec<&str> = bad_proxy.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errors,
        [
            "spec.outboundTrafficPolicy.egressProxy",
            "spec.outboundTrafficPolicy.egressProxy.host",
            "spec.outboundTrafficPolicy.egressProxy.port"
        ]
    );
    // The connection pools are applied, so checked as a DestinationRule's are.
    let bad = parse_file(
        "sc.yaml",
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: s, namespace: shop}\nspec:\n  inboundConnectionPool: {http: {http1MaxPendingRequests: -1}}\n  ingress: [{port: {number: 80, protocol: HTTP, name: http}, defaultEndpoint: '127.0.0.1:8080', connectionPool: {tcp: {connectTimeout: soon}}}]\n",
    );
    let errors: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errors,
        [
            "spec.inboundConnectionPool.http.http1MaxPendingRequests",
            "spec.ingress[0].connectionPool.tcp.connectTimeout"
        ]
    );
}

#[test]
fn tls_routes_need_sni_hosts_within_the_virtual_service_hosts() {
    let vs = |tls: &str| {
        parse_file(
            "vs.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: shop}}\nspec:\n  hosts: ['*.example.com', api.shop.io]\n  tls:\n{tls}"
            ),
        )
    };
    let bad = vs(concat!(
        "  - route: [{destination: {host: web}}]\n",
        "  - match: [{sniHosts: []}, {sniHosts: [other.org, 'a.*.com']}]\n",
        "    route: [{destination: {host: web}, weight: 50}]\n",
    ));
    assert!(bad.objects.is_empty());
    let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.tls[0].match",
            "spec.tls[1].match[0].sniHosts",
            "spec.tls[1].match[1].sniHosts[0]",
            "spec.tls[1].match[1].sniHosts[1]",
        ]
    );
    let good = vs(concat!(
        "  - match: [{sniHosts: [a.example.com, '*.example.com', api.shop.io], port: 443}]\n",
        "    route: [{destination: {host: web, port: {number: 8443}}}]\n",
        "  - match: [{sniHosts: [10.0.0.1]}]\n",
        "    route: [{destination: {host: web}}]\n",
    ));
    assert_eq!(good.objects.len(), 1, "{:?}", good.issues);
    let warned: Vec<&str> = good.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(warned, ["spec.tls[1].match[0].sniHosts[0]"]);
}

#[test]
fn locality_settings_are_checked_as_istio_checks_them() {
    let dr = |setting: &str, outlier: &str| {
        parse_file(
            "dr.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer:\n      localityLbSetting: {setting}\n{outlier}"
            ),
        )
    };
    let errors = |setting: &str| {
        let parsed = dr(setting, "");
        assert!(parsed.objects.is_empty(), "{setting} is rejected");
        parsed
            .errors()
            .map(|e| {
                e.field
                    .rsplit("localityLbSetting")
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        errors("{distribute: [{from: a/*, to: {b/*: 100}}], failover: [{from: a, to: b}]}"),
        [""]
    );
    assert_eq!(
        errors(
            "{distribute: [{from: a/*/c, to: {b/*: 60, c/*: 30}}, {from: b, to: {a: 0, c: 100}}]}"
        ),
        [
            ".distribute[0].from",
            ".distribute[0].to",
            ".distribute[1].to[a]"
        ]
    );
    assert_eq!(
        errors(
            "{failover: [{from: a, to: a}, {from: a/z, to: b*}], failoverPriority: [topology.kubernetes.io/zone]}"
        ),
        [
            ".failoverPriority[0]",
            ".failover[0]",
            ".failover[1]",
            ".failover[1]"
        ]
    );
    // Failover without outlier detection: accepted, with a warning.
    let outlier = "    outlierDetection: {consecutive5xxErrors: 1}\n";
    for (rest, warned) in [("", true), (outlier, false)] {
        let parsed = dr(
            "{failoverPriority: [tier], failover: [{from: a, to: b}]}",
            rest,
        );
        assert_eq!(parsed.objects.len(), 1, "{:?}", parsed.issues);
        assert_eq!(
            parsed
                .issues
                .iter()
                .any(|i| i.field.ends_with("localityLbSetting")),
            warned
        );
    }
}

#[test]
fn a_tunnel_is_checked_as_istiod_checks_it_and_a_translated_rule_warns_about_nothing() {
    let parsed = parse_file(
        "dr.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {mode: SIMPLE, credentialName: api-cert}\n    loadBalancer: {simple: ROUND_ROBIN, warmupDurationSecs: 10s}\n    tunnel: {protocol: CONNECT, targetHost: proxy.example.com, targetPort: 8080}\n    portLevelSettings:\n    - port: {number: 443}\n      tls: {mode: MUTUAL, clientCertificate: /c.pem, privateKey: /k.pem}\n",
    );
    assert_eq!(parsed.objects.len(), 1, "accepted: {:?}", parsed.issues);
    let warned: Vec<&str> = (parsed.issues.iter())
        .filter(|i| i.level == super::super::Level::Warning)
        .map(|i| i.field.as_str())
        .collect();
    assert!(warned.is_empty(), "{warned:?}");
    let errors = |tunnel: &str, extra: &str| -> Vec<String> {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tunnel: {tunnel}\n{extra}"
        );
        (parse_file("dr.yaml", &yaml).issues.iter())
            .map(|i| format!("{} {}", i.field, i.message))
            .collect()
    };
    assert!(
        errors(
            "{targetHost: 10.0.0.1, targetPort: 3128, protocol: POST}",
            ""
        )
        .is_empty()
    );
    assert_eq!(
        errors("{protocol: GET, targetHost: 'bad host', targetPort: 0}", ""),
        [
            "spec.trafficPolicy.tunnel.protocol \"GET\": tunnel protocol must be \"CONNECT\" or \"POST\"",
            "spec.trafficPolicy.tunnel.targetHost \"bad host\" must be a valid FQDN or IP address",
            "spec.trafficPolicy.tunnel.targetPort 0 is not a port (1-65535)",
        ]
    );
    assert_eq!(
        errors(
            "{targetHost: a.example.com, targetPort: 443}",
            "    proxyProtocol: {}\n"
        ),
        ["spec.trafficPolicy tunnel and proxyProtocol must not be set together"]
    );
    // Warm-up is applied, so checked.
    let warmup = |lb: &str| {
        let parsed = parse_file(
            "dr.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: r, namespace: shop}}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    loadBalancer: {lb}\n"
            ),
        );
        (parsed.issues.iter())
            .map(|i| i.field.clone())
            .collect::<Vec<_>>()
    };
    assert!(warmup("{warmup: {duration: 30s, minimumPercent: 20, aggression: 2}}").is_empty());
    let f = "spec.trafficPolicy.loadBalancer";
    assert_eq!(
        warmup("{warmupDurationSecs: soon, warmup: {minimumPercent: 120, aggression: 0.5}}"),
        [
            format!("{f}.warmupDurationSecs"),
            format!("{f}.warmup.duration"),
            format!("{f}.warmup.minimumPercent"),
            format!("{f}.warmup.aggression"),
        ]
    );
}

#[test]
fn client_tls_needs_its_files_for_mutual_and_none_for_istio_mutual() {
    let parsed = parse_file(
        "dr.yaml",
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: r, namespace: shop}\nspec:\n  host: api.example.com\n  trafficPolicy:\n    tls: {mode: MUTUAL, clientCertificate: /c.pem}\n  subsets:\n  - name: v1\n    trafficPolicy: {tls: {mode: ISTIO_MUTUAL, caCertificates: /ca.pem}}\n",
    );
    assert!(parsed.objects.is_empty());
    let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.trafficPolicy.tls.privateKey",
            "spec.subsets[0].trafficPolicy.tls",
        ]
    );
}

#[test]
fn an_invalid_regex_is_rejected_with_its_field() {
    let text = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad, namespace: default}
spec:
  hosts: [web]
  http:
  - match: [{uri: {regex: "/(unclosed"}}]
    route: [{destination: {host: web}}]
"#;
    let parsed = parse_file("bad.yaml", text);
    assert!(parsed.objects.is_empty());
    let e = parsed.errors().next().unwrap();
    assert_eq!(e.field, "spec.http[0].match[0].uri.regex");
    assert!(e.message.contains("invalid regex"), "{}", e.message);
}

#[test]
fn a_route_needs_an_action_and_a_string_match_needs_one_form() {
    let text = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bad}
spec:
  hosts: [web]
  http:
  - match: [{uri: {exact: /a, prefix: /b}}]
    timeout: soon
"#;
    let parsed = parse_file("bad.yaml", text);
    let fields: Vec<_> = parsed.errors().map(|e| e.field.as_str()).collect();
    assert!(fields.contains(&"spec.http[0].match[0].uri"), "{fields:?}");
    assert!(fields.contains(&"spec.http[0]"), "{fields:?}");
    assert!(fields.contains(&"spec.http[0].timeout"), "{fields:?}");
}

#[test]
fn service_entry_addresses_are_ip_addresses_or_cidr_ranges() {
    let errors = |addresses: &str| {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: db, namespace: shop}}\nspec:\n  hosts: [db.corp.example]\n  addresses: {addresses}\n  ports: [{{number: 5432, name: tcp, protocol: TCP}}]\n  resolution: NONE\n"
        );
        let parsed = parse_file("x.yaml", &yaml);
        (parsed.errors())
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect::<Vec<_>>()
    };
    let valid = "[10.50.0.8, 192.168.8.0/24, 10.50.0.7/32, 'fd00::/64', 'fd00::1']";
    assert_eq!(errors(valid), Vec::<String>::new());
    assert_eq!(
        errors("[db.corp.example, 10.0.0.0/33, '10.0.0.1/', 'fd00::/129']"),
        [
            "spec.addresses[0]: \"db.corp.example\" is neither an IP address nor a CIDR range",
            "spec.addresses[1]: \"10.0.0.0/33\" is neither an IP address nor a CIDR range",
            "spec.addresses[2]: \"10.0.0.1/\" is neither an IP address nor a CIDR range",
            "spec.addresses[3]: \"fd00::/129\" is neither an IP address nor a CIDR range",
        ]
    );
}

#[test]
fn a_plaintext_servers_tls_is_only_an_https_redirect() {
    let gw = |servers: &str| {
        let parsed = parse_file(
            "gw.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: g, namespace: shop}}\nspec:\n  servers:\n{servers}"
            ),
        );
        let errors: Vec<String> = parsed.errors().map(|e| e.field.clone()).collect();
        let warnings: Vec<String> = (parsed.issues.iter())
            .filter(|i| !errors.contains(&i.field))
            .map(|i| i.field.clone())
            .collect();
        (errors, warnings)
    };
    let (errors, warnings) = gw(concat!(
        "  - {port: {number: 80, name: a, protocol: HTTP}, hosts: ['*'], tls: {httpsRedirect: true}}\n",
        "  - {port: {number: 443, name: b, protocol: HTTPS}, hosts: ['*'], tls: {mode: SIMPLE, credentialName: c, httpsRedirect: true}}\n",
    ));
    assert!(errors.is_empty(), "{errors:?}");
    // As istiod warns: the flag means nothing on an HTTPS server.
    assert_eq!(warnings, ["spec.servers[1].tls.httpsRedirect"]);
    let (errors, _) = gw(concat!(
        "  - {port: {number: 80, name: a, protocol: HTTP}, hosts: ['*'], tls: {mode: SIMPLE, credentialName: c}}\n",
        "  - {port: {number: 81, name: b, protocol: HTTP}, hosts: ['*'], tls: {httpsRedirect: true, serverCertificate: /c.pem}}\n",
        "  - {port: {number: 82, name: c, protocol: TCP}, hosts: ['*'], tls: {httpsRedirect: true}}\n",
    ));
    assert_eq!(
        errors,
        [
            "spec.servers[0].tls",
            "spec.servers[1].tls",
            "spec.servers[2].tls"
        ]
    );
}

#[test]
fn an_access_log_encoding_or_json_format_that_cannot_apply_is_warned_about() {
    let mesh = |lines: &str| {
        let parsed = parse_file(
            "mesh.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: istio, namespace: istio-system}}\ndata:\n  mesh: |\n    accessLogFile: /dev/stdout\n{lines}"
            ),
        );
        assert_eq!(parsed.objects.len(), 1, "{:?}", parsed.issues);
        let warned: Vec<String> = parsed.issues.iter().map(|i| i.field.clone()).collect();
        warned
    };
    assert!(mesh("    accessLogEncoding: JSON\n").is_empty());
    assert!(mesh("    accessLogEncoding: TEXT\n    accessLogFormat: '%DURATION%'\n").is_empty());
    assert_eq!(
        mesh("    accessLogEncoding: XML\n"),
        ["data.mesh.accessLogEncoding"]
    );
    assert_eq!(
        mesh("    accessLogEncoding: JSON\n    accessLogFormat: '%DURATION%'\n"),
        ["data.mesh.accessLogFormat"]
    );
}

#[test]
fn the_meshs_cluster_defaults_must_be_durations_and_known_policies() {
    let parsed = parse_file(
        "mesh.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    connectTimeout: soon\n    h2UpgradePolicy: SOMETIMES\n    tcpKeepalive: {time: 600s, interval: often}\n",
    );
    let errors: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errors,
        [
            "data.mesh.connectTimeout",
            "data.mesh.h2UpgradePolicy",
            "data.mesh.tcpKeepalive.interval"
        ]
    );
}

#[test]
fn a_tracing_percentage_out_of_range_and_a_tag_of_no_single_kind_are_warned_about() {
    let parsed = parse_file(
        "mesh.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    defaultConfig:\n      tracing:\n        sampling: -3\n        customTags:\n          ok: {literal: {value: x}}\n          empty: {}\n          both: {literal: {value: x}, header: {name: y}}\n",
    );
    assert_eq!(parsed.errors().count(), 0);
    let warnings: Vec<&str> = (parsed.issues.iter())
        .filter(|i| i.level == crate::config::Level::Warning)
        .map(|i| i.field.as_str())
        .collect();
    assert_eq!(
        warnings,
        [
            "data.mesh.defaultConfig.tracing.sampling",
            "data.mesh.defaultConfig.tracing.customTags[both]",
            "data.mesh.defaultConfig.tracing.customTags[empty]",
        ]
    );
}

#[test]
fn the_meshs_listener_and_route_settings_must_be_what_envoy_takes() {
    let parsed = parse_file(
        "mesh.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    defaultHttpRetryPolicy: {attempts: 3, perTryTimeout: soon, backoff: 25ms}\n    defaultInboundHttpRetryPolicy: {attempts: -1, backoff: later}\n    pathNormalization: {normalization: SOMETIMES}\n    inboundTrafficPolicy: {mode: NOWHERE}\n    protocolDetectionTimeout: soonish\n    defaultConfig: {gatewayTopology: {forwardClientCertDetails: KEEP}, proxyHeaders: {server: {disabled: maybe}}}\n",
    );
    let errors: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        errors,
        [
            "data.mesh.protocolDetectionTimeout",
            "data.mesh.inboundTrafficPolicy.mode",
            "data.mesh.pathNormalization.normalization",
            "data.mesh.defaultHttpRetryPolicy.perTryTimeout",
            "data.mesh.defaultInboundHttpRetryPolicy.attempts",
            "data.mesh.defaultInboundHttpRetryPolicy.backoff",
            "data.mesh.defaultConfig.gatewayTopology.forwardClientCertDetails",
            "data.mesh.defaultConfig.proxyHeaders.server.disabled",
        ]
    );
}

#[test]
fn request_authentication_is_checked_as_istio_checks_it() {
    let ra = |spec: &str| {
        parse_file(
            "ra.yaml",
            &format!(
                "apiVersion: security.istio.io/v1beta1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: shop}}\nspec:\n{spec}"
            ),
        )
    };
    let good = ra(&format!(
        "  selector: {{matchLabels: {{app: web}}}}\n  jwtRules:\n  - issuer: https://a.example\n    jwksUri: https://a.example/keys\n    timeout: 2s\n  - issuer: b\n    jwks: '{}'\n",
        crate::jwks::fail_closed()
    ));
    assert!(good.issues.is_empty(), "{:?}", good.issues);
    assert_eq!(good.objects.len(), 1);
    let bad = ra(
        "  targetRefs: [{kind: Gateway, name: g}]\n  jwtRules:\n  - audiences: ['']\n    fromHeaders: [{name: ''}]\n    fromParams: ['']\n    fromCookies: ['']\n    outputClaimToHeaders: [{header: 'x sub', claim: sub}]\n    timeout: soon\n  - issuer: c\n    jwksUri: ftp://c.example/keys\n    jwks: '{\"keys\": {}}'\n",
    );
    assert!(bad.objects.is_empty());
    let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.targetRefs",
            "spec.jwtRules[0].issuer",
            "spec.jwtRules[0].audiences[0]",
            "spec.jwtRules[0].fromHeaders[0].name",
            "spec.jwtRules[0].fromParams[0]",
            "spec.jwtRules[0].fromCookies[0]",
            "spec.jwtRules[0].outputClaimToHeaders[0]",
            "spec.jwtRules[0].timeout",
            "spec.jwtRules[1].jwksUri",
            "spec.jwtRules[1].jwks",
        ]
    );
}

#[test]
fn request_principals_and_request_auth_keys_are_accepted_and_malformed_claims_refused() {
    let ap = |rule: &str| {
        parse_file(
            "ap.yaml",
            &format!(
                "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: p, namespace: shop}}\nspec:\n  rules:\n  - {rule}\n"
            ),
        )
    };
    for rule in [
        "from: [{source: {requestPrincipals: ['*'], notRequestPrincipals: ['a/b']}}]",
        "when: [{key: request.auth.principal, values: ['a/*']}]",
        "when: [{key: request.auth.audiences, values: [api]}]",
        "when: [{key: request.auth.presenter, values: [app]}]",
        "when: [{key: 'request.auth.claims[groups]', values: [admins]}]",
        "when: [{key: 'request.auth.claims[nested][key]', values: [v]}]",
    ] {
        let parsed = ap(rule);
        assert!(
            parsed.errors().next().is_none(),
            "{rule}: {:?}",
            parsed.issues
        );
    }
    for key in [
        "request.auth.claims[]",
        "request.auth.claims",
        "request.auth.claims[a]x",
        "request.auth.raw",
    ] {
        let parsed = ap(&format!("when: [{{key: '{key}', values: [v]}}]"));
        let fields: Vec<&str> = parsed.errors().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.rules[0].when[0].key"], "{key}");
    }
}

#[test]
fn telemetry_is_checked_and_what_meshd_does_not_apply_reported() {
    let tel = |spec: &str| {
        parse_file(
            "t.yaml",
            &format!(
                "apiVersion: telemetry.istio.io/v1alpha1\nkind: Telemetry\nmetadata: {{name: t, namespace: shop}}\nspec:\n{spec}"
            ),
        )
    };
    let good = tel(
        "  selector: {matchLabels: {app: web}}\n  accessLogging:\n  - match: {mode: SERVER}\n    providers: [{name: envoy}]\n    filter: {expression: 'response.code >= 400'}\n  - disabled: true\n",
    );
    assert!(good.issues.is_empty(), "{:?}", good.issues);
    assert_eq!(good.objects.len(), 1);
    let bad = tel(
        "  targetRef: {kind: Gateway, name: g}\n  accessLogging:\n  - match: {mode: BOTH}\n    providers: [{name: ''}]\n    filter: {expression: ' '}\n  - filter: {expression: 'response.code >='}\n",
    );
    let fields: Vec<&str> = bad.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.targetRefs",
            "spec.accessLogging[0].match.mode",
            "spec.accessLogging[0].providers[0].name",
            "spec.accessLogging[0].filter.expression",
            "spec.accessLogging[1].filter.expression",
        ]
    );
    let tracing = tel(
        "  tracing:\n  - {match: {mode: CLIENT}, providers: [{name: zipkin}], randomSamplingPercentage: 10}\n  - {randomSamplingPercentage: 101, match: {mode: ALL}}\n",
    );
    let fields: Vec<&str> = tracing.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.tracing[1].match.mode",
            "spec.tracing[1].randomSamplingPercentage"
        ]
    );
    let unapplied = tel(
        "  tracing: [{useRequestIdForTraceSampling: false, disableContextPropagation: true}]\n  metrics: [{providers: [{name: prometheus}]}]\n",
    );
    assert_eq!(unapplied.objects.len(), 1);
    let warned: Vec<&str> = unapplied.issues.iter().map(|i| i.field.as_str()).collect();
    assert_eq!(
        warned,
        [
            "spec.tracing[0].useRequestIdForTraceSampling",
            "spec.tracing[0].disableContextPropagation",
        ]
    );
    let metrics = tel(
        "  metrics:\n  - providers: [{name: ''}]\n    reportingInterval: often\n    overrides:\n    - match: {metric: REQUEST_TOTAL, mode: BOTH}\n      tagOverrides:\n        a: {value: 'request.host'}\n        b: {}\n        c: {operation: REMOVE, value: x}\n        d: {operation: DROP}\n        e: {value: 'request.host =='}\n    - match: {customMetric: ''}\n",
    );
    let fields: Vec<&str> = metrics.errors().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.metrics[0].providers[0].name",
            "spec.metrics[0].reportingInterval",
            "spec.metrics[0].overrides[0].match.metric",
            "spec.metrics[0].overrides[0].match.mode",
            "spec.metrics[0].overrides[0].tagOverrides[b].value",
            "spec.metrics[0].overrides[0].tagOverrides[c].value",
            "spec.metrics[0].overrides[0].tagOverrides[d].operation",
            "spec.metrics[0].overrides[0].tagOverrides[e].value",
            "spec.metrics[0].overrides[1].match.customMetric",
        ]
    );
    let good = tel(
        "  metrics:\n  - providers: [{name: prometheus}]\n    reportingInterval: 15s\n    overrides: [{match: {metric: REQUEST_COUNT, mode: CLIENT}, tagOverrides: {host: {value: 'request.host'}, grpc_response_status: {operation: REMOVE}}}]\n",
    );
    assert_eq!(good.issues, []);
}

/// Route header matches take what istiod takes: RFC 7230 tokens in any case (Knative's
/// `K-Network-Hash`), pseudo-headers and JWT claims; not spaces, colons elsewhere or an
/// empty claim.
#[test]
fn header_matches_take_token_names_in_any_case_pseudo_headers_and_claims() {
    let errors = |header: &str| {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: r, namespace: shop}}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{{headers: {{'{header}': {{exact: x}}}}}}]\n    route: [{{destination: {{host: reviews}}}}]\n"
        );
        parse_file("vs.yaml", &yaml).errors().count()
    };
    for good in [
        "K-Network-Hash",
        "end-user",
        ":authority",
        "@request.auth.claims.group",
        "@request.auth.claims[Group]",
    ] {
        assert_eq!(errors(good), 0, "{good}");
    }
    for bad in ["bad header", "x:y", "@request.auth.claims[]", ":other"] {
        assert_eq!(errors(bad), 1, "{bad}");
    }
}

fn problems(parsed: &super::super::parse::Parsed) -> Vec<String> {
    (parsed.issues.iter())
        .map(|i| format!("{:?} {}: {}", i.level, i.field, i.message))
        .collect()
}

#[test]
fn the_meshs_tls_settings_take_istios_versions_and_warn_about_unknown_suites() {
    let parsed = parse_file(
        "mesh.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: istio, namespace: istio-system}\ndata:\n  mesh: |\n    meshMTLS: {minProtocolVersion: TLSV1_1, cipherSuites: [AES128-SHA, RC4-MD5], ecdhCurves: [P-256]}\n    tlsDefaults: {minProtocolVersion: TLSV1_3, cipherSuites: [AES128-SHA, AES128-SHA], ecdhCurves: [P-256, P-257]}\n",
    );
    assert_eq!(
        problems(&parsed),
        [
            "Error data.mesh.meshMTLS.minProtocolVersion: \"TLSV1_1\" is not TLS_AUTO, TLSV1_2 or TLSV1_3",
            "Warning data.mesh.meshMTLS.cipherSuites: ignoring invalid cipher suites: [\"RC4-MD5\"]",
            "Error data.mesh.meshMTLS.ecdhCurves: mesh TLS does not support ECDH curves configuration",
            "Warning data.mesh.tlsDefaults.cipherSuites: ignoring duplicate cipher suites: [\"AES128-SHA\"]",
            "Warning data.mesh.tlsDefaults.ecdhCurves: detected unrecognized ECDH curves: [\"P-257\"]",
        ]
    );
}

#[test]
fn a_gateway_servers_tls_versions_are_istios_and_the_minimum_is_not_above_the_maximum() {
    let gw = |tls: &str| {
        let parsed = parse_file(
            "gw.yaml",
            &format!(
                "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {{name: g, namespace: shop}}\nspec:\n  servers:\n  - {{port: {{number: 443, name: b, protocol: HTTPS}}, hosts: ['*'], tls: {{mode: SIMPLE, credentialName: c, {tls}}}}}\n"
            ),
        );
        problems(&parsed)
    };
    assert!(gw("minProtocolVersion: TLSV1_2, maxProtocolVersion: TLSV1_3").is_empty());
    assert_eq!(
        gw("minProtocolVersion: TLSV1_3, maxProtocolVersion: TLSV1_2"),
        [
            "Error spec.servers[0].tls.minProtocolVersion: is above maxProtocolVersion: Envoy would refuse the listener"
        ]
    );
    assert_eq!(
        gw("maxProtocolVersion: TLS1.3"),
        [
            "Error spec.servers[0].tls.maxProtocolVersion: \"TLS1.3\" is not TLS_AUTO, TLSV1_0, TLSV1_1, TLSV1_2 or TLSV1_3"
        ]
    );
    assert_eq!(
        gw(
            "minProtocolVersion: TLSV1_0, cipherSuites: [ECDHE-RSA-AES128-GCM-SHA256, NULL-MD5, '-AES128-SHA']"
        ),
        [
            "Warning spec.servers[0].tls.cipherSuites: ignoring invalid cipher suites: [\"NULL-MD5\"]"
        ]
    );
    assert_eq!(
        gw("minProtocolVersion: TLSV1_1").len(),
        1,
        "below TLS 1.2 without suites is warned about"
    );
}
