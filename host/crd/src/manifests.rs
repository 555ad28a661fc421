//! The CustomResourceDefinitions as YAML, as Kubernetes and kubectl read them.

/// The CRDs, one YAML document each, by file name (what `egress-operator crdgen` writes).
pub fn manifests() -> Result<Vec<(&'static str, String)>, serde_json::Error> {
    use kube::CustomResourceExt;
    let yaml = |crd| -> Result<String, serde_json::Error> {
        let mut crd = serde_json::to_value(crd)?;
        kubernetes_formats(&mut crd);
        let yaml = serde_norway::to_string(&crd).map_err(serde::ser::Error::custom)?;
        Ok(yaml_1_1_safe(&yaml))
    };
    Ok(vec![
        (
            "proxies.egress-operator.io.yaml",
            yaml(crate::Proxy::crd())?,
        ),
        (
            "proxypools.egress-operator.io.yaml",
            yaml(crate::ProxyPool::crd())?,
        ),
        (
            "providerconfigs.egress-operator.io.yaml",
            yaml(crate::ProviderConfig::crd())?,
        ),
    ])
}

/// Rust's unsigned integer formats (`uint32`, …) as the OpenAPI ones Kubernetes knows: a real API
/// server warns of every format it does not recognise on each apply of the CRD. The `minimum: 0`
/// beside them keeps them unsigned.
fn kubernetes_formats(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(fields) => {
            if let Some(format) = fields.get_mut("format") {
                match format.as_str() {
                    Some("uint8" | "uint16" | "uint32") => *format = "int32".into(),
                    Some("uint64" | "uint") => *format = "int64".into(),
                    _ => {}
                }
            }
            fields.values_mut().for_each(kubernetes_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(kubernetes_formats),
        _ => {}
    }
}

/// `yaml` (YAML 1.2, as serde writes it) with every plain scalar that YAML 1.1, and not 1.2,
/// reads as a boolean quoted (`true` and `false` are booleans in both, and serde quotes them when
/// they are strings). kubectl reads YAML 1.1: an enum value `Off` written plain reached a real API server as
/// `false`, and the CRD then refused the value it documents.
fn yaml_1_1_safe(yaml: &str) -> String {
    const BOOLEANS: &[&str] = &[
        "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off",
        "OFF",
    ];
    let mut out = String::with_capacity(yaml.len() + 16);
    for line in yaml.lines() {
        let (head, scalar) = match line.rsplit_once(": ") {
            Some((head, scalar)) => (format!("{head}: "), scalar),
            None => match line.trim_start().strip_prefix("- ") {
                Some(scalar) => (line[..line.len() - scalar.len()].to_owned(), scalar),
                None => (String::new(), line),
            },
        };
        if !head.is_empty() && BOOLEANS.contains(&scalar) {
            out.push_str(&format!("{head}'{scalar}'\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_yaml_1_1_reads_as_booleans_are_quoted_in_the_crds() {
        assert_eq!(
            yaml_1_1_safe("enum:\n- Delete\n- Off\ndefault: Off\nkeep: true\nx: Offline\n"),
            "enum:\n- Delete\n- 'Off'\ndefault: 'Off'\nkeep: true\nx: Offline\n"
        );
        for (_, yaml) in manifests().unwrap() {
            assert!(!yaml.lines().any(|line| line.ends_with("- Off")), "{yaml}");
            assert!(!yaml.contains("format: uint"), "{yaml}");
        }
    }
}
