//! A Proxy's health check: how the operator asks the proxy service in the VM whether it
//! answers, beyond the hypervisor's word that the VM runs.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How the operator probes the proxy service at the VM's address: exactly one of `tcp` and
/// `httpConnect`, how often, how many failures in a row make it unhealthy, and how long a new
/// VM may take to start answering.
#[derive(Clone, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "[has(self.tcp), has(self.httpConnect)].filter(x, x).size() == 1",
        "message": "healthCheck takes exactly one of tcp and httpConnect",
    },
    {
        "rule": "self.periodSeconds >= 1 && self.periodSeconds <= 3600",
        "message": "healthCheck.periodSeconds is between 1 and 3600",
    },
    {
        "rule": "self.failureThreshold >= 1 && self.failureThreshold <= 100",
        "message": "healthCheck.failureThreshold is between 1 and 100",
    },
    {
        "rule": "self.startupSeconds <= 86400",
        "message": "healthCheck.startupSeconds is at most 86400 (a day)",
    },
    {
        "rule": "self.timeoutSeconds >= 1 && self.timeoutSeconds < self.periodSeconds",
        "message": "healthCheck.timeoutSeconds is at least 1 and less than periodSeconds",
    },
]))]
pub struct HealthCheck {
    /// Healthy when a TCP connection to this port opens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpProbe>,
    /// Healthy when the proxy at this port answers an HTTP `CONNECT` with a 2xx.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_connect: Option<HttpConnectProbe>,
    /// Seconds between two probes of one VM (default 10).
    #[serde(default = "HealthCheck::default_period_seconds")]
    pub period_seconds: u32,
    /// Failed probes in a row after which the VM is unhealthy (default 3); one success makes it
    /// healthy again.
    #[serde(default = "HealthCheck::default_failure_threshold")]
    pub failure_threshold: u32,
    /// Seconds after the VM started during which failures keep it starting rather than
    /// unhealthy (default 300): a booting VM's service is not up yet. The first success ends it.
    #[serde(default = "HealthCheck::default_startup_seconds")]
    pub startup_seconds: u32,
    /// Seconds one probe may take, connecting and reading the answer (default 3); less than
    /// `periodSeconds`.
    #[serde(default = "HealthCheck::default_timeout_seconds")]
    pub timeout_seconds: u32,
}

/// Probe by opening a TCP connection.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.port >= 1 && self.port <= 65535",
        "message": "healthCheck.tcp.port is between 1 and 65535",
    },
]))]
pub struct TcpProbe {
    /// The port at the VM's address.
    pub port: u32,
}

/// Probe by asking the proxy to open a tunnel: `CONNECT <target> HTTP/1.1`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.port >= 1 && self.port <= 65535",
        "message": "healthCheck.httpConnect.port is between 1 and 65535",
    },
    {
        "rule": "self.target.matches('^(\\\\[[0-9A-Fa-f:.]+\\\\]|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?):([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])$')",
        "message": "healthCheck.httpConnect.target is host:port (a DNS name, an IPv4 address or a bracketed IPv6 address, and a port between 1 and 65535), e.g. example.com:443",
    },
]))]
pub struct HttpConnectProbe {
    /// The port of the proxy at the VM's address.
    pub port: u32,
    /// Where the tunnel is asked to go, `host:port`; the proxy's answer is what counts, so a
    /// target it is allowed to reach. At most [`MAX_TARGET_LENGTH`] characters: the bound also
    /// keeps the rule's cost within what the API server allows a CEL rule.
    #[schemars(length(max = 261))]
    pub target: String,
}

impl HealthCheck {
    fn default_period_seconds() -> u32 {
        10
    }

    fn default_failure_threshold() -> u32 {
        3
    }

    fn default_startup_seconds() -> u32 {
        300
    }

    fn default_timeout_seconds() -> u32 {
        3
    }

    /// Seconds between two probes.
    pub fn period(&self) -> Duration {
        Duration::from_secs(self.period_seconds.into())
    }

    /// The port probed: the `tcp` one, else the `httpConnect` one (the one a Service lists).
    pub fn port(&self) -> u32 {
        match (&self.tcp, &self.http_connect) {
            (Some(tcp), _) => tcp.port,
            (None, Some(connect)) => connect.port,
            (None, None) => 0,
        }
    }

    /// How long one probe may take.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_seconds.into())
    }

    /// How long after the VM started failures keep it starting.
    pub fn startup(&self) -> Duration {
        Duration::from_secs(self.startup_seconds.into())
    }

    /// The rules the CRD's schema enforces, for where no API server applies them (local mode):
    /// the first broken one, in the schema's words.
    pub fn validate(&self) -> Result<(), String> {
        let port_in_range = |port: u32| (1..=65535).contains(&port);
        match (&self.tcp, &self.http_connect) {
            (Some(tcp), None) if !port_in_range(tcp.port) => {
                return Err("healthCheck.tcp.port is between 1 and 65535".into());
            }
            (None, Some(connect)) if !port_in_range(connect.port) => {
                return Err("healthCheck.httpConnect.port is between 1 and 65535".into());
            }
            (None, Some(connect)) if !is_host_port(&connect.target) => {
                return Err(format!(
                    "healthCheck.httpConnect.target is host:port, e.g. example.com:443, not {:?}",
                    connect.target
                ));
            }
            (Some(_), None) | (None, Some(_)) => {}
            _ => return Err("healthCheck takes exactly one of tcp and httpConnect".into()),
        }
        if !(1..=3600).contains(&self.period_seconds) {
            return Err("healthCheck.periodSeconds is between 1 and 3600".into());
        }
        if !(1..=100).contains(&self.failure_threshold) {
            return Err("healthCheck.failureThreshold is between 1 and 100".into());
        }
        if self.startup_seconds > 86400 {
            return Err("healthCheck.startupSeconds is at most 86400 (a day)".into());
        }
        if self.timeout_seconds < 1 || self.timeout_seconds >= self.period_seconds {
            return Err(
                "healthCheck.timeoutSeconds is at least 1 and less than periodSeconds".into(),
            );
        }
        Ok(())
    }
}

/// The longest `target`: a 253-character DNS name (or a bracketed IPv6 address), `:`, a port.
pub const MAX_TARGET_LENGTH: usize = 261;

/// `host:port` as the schema's pattern accepts it: a DNS name or IPv4 address, or an IPv6
/// address in brackets, then a port between 1 and 65535.
fn is_host_port(target: &str) -> bool {
    if target.len() > MAX_TARGET_LENGTH {
        return false;
    }
    let Some((host, port)) = target.rsplit_once(':') else {
        return false;
    };
    let port_ok = !port.starts_with('0')
        && port.bytes().all(|byte| byte.is_ascii_digit())
        && port.parse::<u16>().is_ok_and(|port| port >= 1);
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(ipv6) => {
            !ipv6.is_empty()
                && ipv6
                    .bytes()
                    .all(|byte| byte.is_ascii_hexdigit() || byte == b':' || byte == b'.')
        }
        None => {
            let bytes = host.as_bytes();
            !bytes.is_empty()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'.' || *b == b'-')
                && bytes[0].is_ascii_alphanumeric()
                && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        }
    };
    port_ok && host_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str) -> HealthCheck {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn left_out_numbers_take_their_defaults() {
        let check = check(r#"{"tcp":{"port":3128}}"#);
        assert_eq!(
            (
                check.period_seconds,
                check.failure_threshold,
                check.startup_seconds,
                check.timeout_seconds
            ),
            (10, 3, 300, 3)
        );
        assert_eq!(check.validate(), Ok(()));
    }

    #[test]
    fn validate_refuses_what_the_schema_refuses_naming_the_field() {
        let refused = |json: &str, words: &str| {
            let error = check(json).validate().unwrap_err();
            assert!(error.contains(words), "{json}: {error}");
        };
        refused("{}", "exactly one of tcp and httpConnect");
        refused(
            r#"{"tcp":{"port":1},"httpConnect":{"port":1,"target":"a:1"}}"#,
            "exactly one",
        );
        refused(r#"{"tcp":{"port":0}}"#, "tcp.port");
        refused(r#"{"tcp":{"port":65536}}"#, "tcp.port");
        refused(
            r#"{"httpConnect":{"port":70000,"target":"a:1"}}"#,
            "httpConnect.port",
        );
        refused(r#"{"tcp":{"port":1},"periodSeconds":0}"#, "periodSeconds");
        refused(
            r#"{"tcp":{"port":1},"failureThreshold":0}"#,
            "failureThreshold",
        );
        refused(
            r#"{"tcp":{"port":1},"startupSeconds":90000}"#,
            "startupSeconds",
        );
        refused(
            r#"{"tcp":{"port":1},"timeoutSeconds":10}"#,
            "timeoutSeconds",
        );
        refused(r#"{"tcp":{"port":1},"timeoutSeconds":0}"#, "timeoutSeconds");
    }

    #[test]
    fn a_target_is_host_and_port() {
        for good in [
            "example.com:443",
            "10.0.0.1:80",
            "[2001:db8::1]:443",
            "a:65535",
        ] {
            assert!(is_host_port(good), "{good}");
        }
        for bad in [
            "example.com",
            "example.com:",
            ":443",
            "example.com:0",
            "example.com:65536",
            "example.com:044",
            "http://example.com:443",
            "-bad.example:443",
            "[]:443",
            "exa mple.com:443",
        ] {
            assert!(!is_host_port(bad), "{bad}");
        }
        // The schema's maxLength, which keeps the CEL rule's cost within the API server's budget.
        let longest = format!("{}:65535", "a".repeat(MAX_TARGET_LENGTH - 6));
        assert!(is_host_port(&longest));
        assert!(!is_host_port(&format!("a{longest}")));
    }
}
