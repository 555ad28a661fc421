//! `deploy/`: what `kubectl kustomize deploy/` renders parses, its CRDs have structural schemas
//! and are what `egress-operator crdgen` prints, its RBAC grants no more than the operator uses,
//! and its Deployment runs locked down.
//!
//! Needs `kubectl` (Debian's `kubernetes-client`; its kustomize renders offline).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `kubectl kustomize DIR`, every document parsed.
fn kustomize(dir: &Path) -> Vec<Value> {
    let output = Command::new(controlplane::binary("kubectl"))
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    documents(&String::from_utf8(output.stdout).unwrap())
}

fn documents(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|document| Value::deserialize(document).expect("every document parses"))
        .filter(|document| !document.is_null())
        .collect()
}

fn of_kind<'a>(documents: &'a [Value], kind: &str) -> Vec<&'a Value> {
    documents.iter().filter(|d| d["kind"] == kind).collect()
}

fn one<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    let found = of_kind(documents, kind);
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

#[test]
fn kustomize_renders_every_part_of_the_installation() {
    let rendered = kustomize(&repo().join("deploy"));
    for (kind, count) in [
        ("CustomResourceDefinition", 3),
        ("Namespace", 1),
        ("ServiceAccount", 1),
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        // Providers come as images: no volume to fill (deploy/components-volume/ adds one).
        ("PersistentVolumeClaim", 0),
        ("Deployment", 1),
        ("Service", 1),
        // Only where the Prometheus operator runs: deploy/monitoring/.
        ("ServiceMonitor", 0),
    ] {
        assert_eq!(of_kind(&rendered, kind).len(), count, "{kind}");
    }
    let monitoring = kustomize(&repo().join("deploy/monitoring"));
    assert_eq!(
        one(&monitoring, "ServiceMonitor")["metadata"]["namespace"],
        "egress-operator"
    );
    for document in &rendered {
        assert!(document["metadata"]["name"].is_string(), "{document}");
    }
    let examples = kustomize(&repo().join("deploy/examples/proxmox"));
    let pc = one(&examples, "ProviderConfig");
    let secret_ref = &pc["spec"]["grant"]["http"]["credential"]["secretRef"];
    let secret = one(&examples, "Secret");
    assert_eq!(secret["metadata"]["name"], secret_ref["name"]);
    assert!(secret["stringData"][secret_ref["key"].as_str().unwrap()].is_string());
    // The example Proxy names the example ProviderConfig.
    assert_eq!(
        one(&examples, "Proxy")["spec"]["providerConfigRef"],
        pc["metadata"]["name"]
    );
    // The cluster example's pool too, with the example's user-data and a port to publish.
    let pool = kustomize(&repo().join("deploy/examples/cluster"));
    let template = &one(&pool, "ProxyPool")["spec"]["template"]["spec"];
    assert_eq!(template["providerConfigRef"], pc["metadata"]["name"]);
    let user_data = &template["userData"]["configMapKeyRef"]["name"];
    let maps = of_kind(&examples, "ConfigMap");
    assert!(maps.iter().any(|map| map["metadata"]["name"] == *user_data));
    assert!(template["healthCheck"]["httpConnect"]["port"].is_u64());

    // The libvirt example: every Secret and ConfigMap key its grant names is there, and its
    // connections are the ones its configuration uses.
    let kvm = kustomize(&repo().join("deploy/examples/libvirt"));
    let pc = one(&kvm, "ProviderConfig");
    let grant = &pc["spec"]["grant"]["libvirt"];
    let connections = grant["connections"].as_array().unwrap();
    let names: Vec<&Value> = connections.iter().map(|c| &c["name"]).collect();
    let used: Vec<&Value> = pc["spec"]["config"]["connections"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(names, used);
    let data = |kind: &str, reference: &Value| -> bool {
        of_kind(&kvm, kind).iter().any(|object| {
            object["metadata"]["name"] == reference["name"]
                && (object["stringData"][reference["key"].as_str().unwrap()].is_string()
                    || object["data"][reference["key"].as_str().unwrap()].is_string())
        })
    };
    for connection in connections {
        assert!(
            data("Secret", &connection["sshKeySecretRef"]),
            "{connection}"
        );
        assert!(
            data("Secret", &connection["knownHostsSecretRef"]),
            "{connection}"
        );
    }
    assert!(data("ConfigMap", &grant["images"]["caConfigMapRef"]));
    assert_eq!(
        one(&kvm, "Proxy")["spec"]["providerConfigRef"],
        pc["metadata"]["name"]
    );

    // The example by image: pinned by digest (a cluster requires it), its pull Secret a
    // dockerconfigjson one, its CA and signing key present; and it is a valid spec.
    let by_image = kustomize(&repo().join("deploy/examples/proxmox-image"));
    let pc = one(&by_image, "ProviderConfig");
    let component = &pc["spec"]["component"];
    assert!(component["image"].as_str().unwrap().contains("@sha256:"));
    let secret = one(&by_image, "Secret");
    assert_eq!(
        secret["metadata"]["name"],
        component["registry"]["pullSecret"]
    );
    assert_eq!(secret["type"], "kubernetes.io/dockerconfigjson");
    let docker_config: Value =
        serde_json::from_str(secret["stringData"][".dockerconfigjson"].as_str().unwrap()).unwrap();
    assert!(docker_config["auths"].is_object());
    let config_map = |reference: &Value| {
        of_kind(&by_image, "ConfigMap").iter().any(|object| {
            object["metadata"]["name"] == reference["name"]
                && object["data"][reference["key"].as_str().unwrap()].is_string()
        })
    };
    assert!(config_map(&component["registry"]["caConfigMapRef"]));
    for key in component["signedBy"].as_array().unwrap() {
        assert!(config_map(&key["configMapRef"]), "{key}");
    }
    let spec: egress_operator::crd::ProviderConfigSpec =
        serde_json::from_value(pc["spec"].clone()).expect("a valid ProviderConfig spec");
    assert!(spec.component.file.is_empty());
}

/// `deploy/components-volume/`: its PVC, and its patch making it the Deployment's read-only
/// components volume, applied as `kubectl patch` applies it (offline, `--local`).
#[test]
fn the_components_volume_patch_puts_the_pvc_in_place_of_the_empty_folder() {
    let extra = kustomize(&repo().join("deploy/components-volume"));
    let claim = one(&extra, "PersistentVolumeClaim");
    let rendered = kustomize(&repo().join("deploy"));
    let deployment = one(&rendered, "Deployment");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deployment.json");
    std::fs::write(&file, deployment.to_string()).unwrap();
    let patch =
        std::fs::read_to_string(repo().join("deploy/components-volume/components-pvc.yaml"))
            .unwrap();
    let output = Command::new("kubectl")
        .args([
            "patch",
            "--local",
            "--type",
            "strategic",
            "-o",
            "json",
            "-f",
        ])
        .arg(&file)
        .args(["-p", &patch])
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let patched: Value = serde_json::from_slice(&output.stdout).unwrap();
    let volumes = patched["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    let components = volumes.iter().find(|v| v["name"] == "components").unwrap();
    assert_eq!(
        components["persistentVolumeClaim"]["claimName"],
        claim["metadata"]["name"]
    );
    assert_eq!(components["persistentVolumeClaim"]["readOnly"], true);
    assert!(components.get("emptyDir").is_none(), "{components}");
}

/// The rules of a structural schema that a generator could break.
fn structural_problems(schema: &Value, at: &str, problems: &mut Vec<String>) {
    let Some(object) = schema.as_object() else {
        problems.push(format!("{at}: not an object"));
        return;
    };
    let preserves = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    let int_or_string = object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !object.contains_key("type") && !preserves && !int_or_string {
        problems.push(format!("{at}: no type"));
    }
    if object.contains_key("properties") && object.contains_key("additionalProperties") {
        problems.push(format!("{at}: additionalProperties beside properties"));
    }
    if object.contains_key("$ref") {
        problems.push(format!("{at}: $ref"));
    }
    if let Some(items) = object.get("items") {
        if items.is_array() {
            problems.push(format!("{at}: items is a list"));
        } else {
            structural_problems(items, &format!("{at}.items"), problems);
        }
    }
    if let Some(properties) = object.get("properties").and_then(Value::as_object) {
        for (name, property) in properties {
            structural_problems(property, &format!("{at}.{name}"), problems);
        }
    }
    if let Some(additional) = object.get("additionalProperties")
        && additional.is_object()
    {
        structural_problems(additional, &format!("{at}.*"), problems);
    }
    // Inside allOf/anyOf/oneOf/not only value validations: no types, defaults or descriptions.
    for junctor in ["allOf", "anyOf", "oneOf", "not"] {
        let branches: Vec<&Value> = match object.get(junctor) {
            Some(Value::Array(branches)) => branches.iter().collect(),
            Some(branch) => vec![branch],
            None => continue,
        };
        for branch in branches {
            for forbidden in [
                "type",
                "default",
                "description",
                "nullable",
                "additionalProperties",
                "x-kubernetes-preserve-unknown-fields",
            ] {
                if contains_key_deep(branch, forbidden) {
                    problems.push(format!("{at}.{junctor}: {forbidden} inside"));
                }
            }
        }
    }
}

fn contains_key_deep(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(object) => {
            object.contains_key(key) || object.values().any(|v| contains_key_deep(v, key))
        }
        Value::Array(items) => items.iter().any(|v| contains_key_deep(v, key)),
        _ => false,
    }
}

#[test]
fn every_crd_schema_is_structural() {
    let rendered = kustomize(&repo().join("deploy"));
    for crd in of_kind(&rendered, "CustomResourceDefinition") {
        let name = crd["metadata"]["name"].as_str().unwrap();
        for version in crd["spec"]["versions"].as_array().unwrap() {
            let schema = &version["schema"]["openAPIV3Schema"];
            let mut problems = Vec::new();
            structural_problems(schema, name, &mut problems);
            assert_eq!(schema["type"], "object", "{name}");
            assert!(
                problems.is_empty(),
                "{name} is not structural: {problems:#?}"
            );
            assert!(
                version["subresources"]["status"].is_object(),
                "{name} has a status subresource"
            );
        }
    }
}

#[test]
fn the_structural_check_can_fail() {
    let bad: Value = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"description": "no type"},
            "b": {"type": "object", "properties": {}, "additionalProperties": {"type": "string"}},
            "c": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            "d": {"x-kubernetes-int-or-string": true},
            "e": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
        },
    });
    let mut problems = Vec::new();
    structural_problems(&bad, "bad", &mut problems);
    assert_eq!(
        problems,
        [
            "bad.a: no type",
            "bad.b: additionalProperties beside properties",
            "bad.c: no type",
            "bad.c.anyOf: type inside",
            "bad.c.anyOf: type inside",
        ]
    );
}

#[test]
fn the_committed_crds_are_what_crdgen_prints() {
    let out = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_egress-operator"))
        .args(["crdgen", "--out-dir"])
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    let committed = repo().join("deploy/crds");
    let mut generated: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    generated.sort();
    assert_eq!(
        generated,
        [
            "providerconfigs.egress-operator.io.yaml",
            "proxies.egress-operator.io.yaml",
            "proxypools.egress-operator.io.yaml",
        ]
    );
    for file in generated {
        let fresh = std::fs::read_to_string(out.path().join(&file)).unwrap();
        let kept = std::fs::read_to_string(committed.join(&file)).unwrap();
        assert!(
            fresh == kept,
            "deploy/crds/{file} is stale: run `egress-operator crdgen --out-dir deploy/crds`"
        );
    }
}

#[test]
fn the_deployment_runs_locked_down_with_probes_and_its_identity() {
    let rendered = kustomize(&repo().join("deploy"));
    let deployment = one(&rendered, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["serviceAccountName"], "egress-operator");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert!(security["capabilities"]["add"].is_null());
    assert!(security["privileged"].is_null() || security["privileged"] == false);
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    for (variable, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let env = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == variable)
            .unwrap_or_else(|| panic!("{variable} is set"));
        assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], field);
    }
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "run");
    assert!(!args.iter().any(|a| a.starts_with("--local")));
    // The components are read-only to the operator; the compile cache is a writable emptyDir.
    let mounts = container["volumeMounts"].as_array().unwrap();
    let mount = |path: &str| {
        mounts
            .iter()
            .find(|m| m["mountPath"] == path)
            .unwrap_or_else(|| panic!("a volume at {path}"))
    };
    assert_eq!(
        mount("/var/lib/egress-operator/components")["readOnly"],
        true
    );
    let cache = mount("/var/cache/egress-operator");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == cache["name"])
        .unwrap();
    assert!(volume["emptyDir"].is_object());
    assert!(
        args.iter()
            .any(|a| a.starts_with("--cache-dir=/var/cache/egress-operator/"))
    );
    // Pulled images are cached in the same emptyDir; the components folder is an empty one.
    assert!(
        args.iter()
            .any(|a| a.starts_with("--image-cache=/var/cache/egress-operator/"))
    );
    let components = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount("/var/lib/egress-operator/components")["name"])
        .unwrap();
    assert!(components["emptyDir"].is_object(), "{components}");
    // SSH keys from Secrets go to a tmpfs, never a disk: the operator's --key-dir is a
    // memory-backed emptyDir.
    let keys = mount("/run/egress-operator");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == keys["name"])
        .unwrap();
    assert_eq!(volume["emptyDir"]["medium"], "Memory");
    assert!(args.contains(&"--key-dir=/run/egress-operator"));
}

#[test]
fn rbac_grants_only_what_the_operator_uses() {
    let rendered = kustomize(&repo().join("deploy"));
    let cluster = one(&rendered, "ClusterRole");
    let rules = cluster["rules"].as_array().unwrap();
    let verbs_for = |rules: &[Value], resource: &str| -> Vec<String> {
        rules
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| r["verbs"].as_array().unwrap().iter())
            .map(|v| v.as_str().unwrap().to_owned())
            .collect()
    };
    for rule in rules {
        for list in ["verbs", "resources", "apiGroups"] {
            assert!(
                !rule[list].as_array().unwrap().iter().any(|x| x == "*"),
                "no wildcard {list}: {rule}"
            );
        }
    }
    assert_eq!(verbs_for(rules, "secrets"), ["get", "list", "watch"]);
    assert_eq!(verbs_for(rules, "configmaps"), ["get", "list", "watch"]);
    assert_eq!(
        verbs_for(rules, "proxies"),
        ["get", "list", "watch", "patch", "create", "delete"]
    );
    assert_eq!(verbs_for(rules, "proxies/status"), ["patch"]);
    assert_eq!(
        verbs_for(rules, "proxypools"),
        ["get", "list", "watch", "patch"]
    );
    assert_eq!(verbs_for(rules, "proxypools/status"), ["patch"]);
    assert_eq!(verbs_for(rules, "proxypools/finalizers"), ["update"]);
    for published in ["services", "endpointslices"] {
        assert_eq!(
            verbs_for(rules, published),
            ["get", "create", "patch", "delete"]
        );
    }
    assert!(verbs_for(rules, "proxies/finalizers").is_empty());
    assert_eq!(verbs_for(rules, "events"), ["create", "patch"]);
    assert_eq!(verbs_for(rules, "namespaces"), ["get"]);
    let namespaces = rules
        .iter()
        .find(|rule| rule["resources"] == serde_json::json!(["namespaces"]))
        .unwrap();
    assert_eq!(
        namespaces["resourceNames"],
        serde_json::json!(["kube-system"])
    );
    assert!(
        verbs_for(rules, "leases").is_empty(),
        "leases only in the namespace's Role"
    );
    let role = one(&rendered, "Role");
    assert_eq!(role["metadata"]["namespace"], "egress-operator");
    let role_rules = role["rules"].as_array().unwrap();
    assert_eq!(role_rules.len(), 1);
    assert_eq!(
        role_rules[0]["apiGroups"],
        serde_json::json!(["coordination.k8s.io"])
    );
    assert_eq!(verbs_for(role_rules, "leases"), ["get", "create", "patch"]);
}
