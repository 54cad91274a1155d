//! Calico's CNI credential, checked offline first. The token in
//! `calico-kubeconfig`, which install-cni writes into the runtime's CNI
//! config directory (`/etc/cni/net.d`), is a JWT: its `exp` says, with no API
//! at all, whether it has expired (install-cni writes one that lasts a
//! day or so and calico-node renews it). The CA in the file must parse, or
//! the plugin cannot even start TLS. Only then is the API asked, with the
//! plugin's own credentials: a 401 is a rejected token; an API that does
//! not answer says nothing about the token (it was never judged).

use std::time::{Duration, UNIX_EPOCH};

use base64::Engine;
use serde_json::Value;

/// Calico's CNI kubeconfig, in the CNI config directory.
pub const CNI_KUBECONFIG: &str = "calico-kubeconfig";
/// A kubeconfig is kilobytes: a larger file is not one.
pub(super) const KUBECONFIG_MAX: u64 = 1 << 20;
/// How long the API gets to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// What the doctor learnt of the CNI's credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The file, as the node names it.
    pub file: String,
    pub state: State,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// The file cannot be read, or is no kubeconfig the plugin can use.
    Unusable(String),
    /// The token's `exp` (seconds since the epoch) is past, at `now`.
    Expired { exp: u64, now: u64 },
    /// The cluster's CA does not parse: no TLS, so no token is sent.
    BadCa(String),
    /// The API answered 401 to the token.
    Rejected { server: String, message: String },
    /// The API did not answer: the token was never judged. Its `exp`,
    /// when it has one, is still ahead.
    Unreachable {
        server: String,
        why: String,
        expires: Option<u64>,
    },
    /// The API took the token (any answer but a 401 authenticated it).
    Accepted { server: String },
}

/// Offline first (the file, the token's expiry, the CA), then the API.
pub async fn judge(text: &str, now: u64) -> State {
    let file = match kube::config::Kubeconfig::from_yaml(text) {
        Ok(file) => file,
        Err(e) => return State::Unusable(format!("unreadable: {e}")),
    };
    let parts = serde_json::to_value(&file).unwrap_or_default();
    let expires = current(&parts, "users", "user")
        .and_then(|u| u["token"].as_str())
        .and_then(expiry);
    if let Some(exp) = expires.filter(|exp| *exp <= now) {
        return State::Expired { exp, now };
    }
    if let Some(ca) = current(&parts, "clusters", "cluster")
        .and_then(|c| c["certificate-authority-data"].as_str())
    {
        if let Err(why) = check_ca(ca) {
            return State::BadCa(why);
        }
    }
    ask(file, expires).await
}

/// The current context's `cluster` or `user` entry.
fn current<'a>(parts: &'a Value, list: &str, key: &str) -> Option<&'a Value> {
    let context = parts["current-context"].as_str()?;
    let named = parts["contexts"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == context)?;
    let wanted = named["context"][key].as_str()?;
    let entry = parts[list]
        .as_array()?
        .iter()
        .find(|e| e["name"] == wanted)?;
    Some(&entry[key])
}

/// A JWT's `exp` claim (its payload is base64url JSON), if it has one.
pub fn expiry(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims["exp"].as_u64()
}

/// `certificate-authority-data`: base64 of PEM certificates, each base64
/// of DER (an ASN.1 SEQUENCE).
fn check_ca(data: &str) -> Result<(), String> {
    let engine = base64::engine::general_purpose::STANDARD;
    let pem = engine
        .decode(data.trim())
        .map_err(|e| format!("certificate-authority-data is not base64: {e}"))?;
    let pem = String::from_utf8_lossy(&pem);
    let mut found = 0;
    for block in pem.split("-----BEGIN CERTIFICATE-----").skip(1) {
        let body = block
            .split("-----END CERTIFICATE-----")
            .next()
            .unwrap_or_default();
        let body: String = body.split_whitespace().collect();
        let der = engine.decode(body).map_err(|e| {
            format!("certificate-authority-data holds a certificate that is not base64: {e}")
        })?;
        if der.first() != Some(&0x30) {
            return Err("certificate-authority-data holds a certificate that is not DER".into());
        }
        found += 1;
    }
    if found == 0 {
        return Err("certificate-authority-data holds no PEM certificate".into());
    }
    Ok(())
}

/// Asks the API its version with the plugin's credentials.
async fn ask(file: kube::config::Kubeconfig, expires: Option<u64>) -> State {
    let config = match kube::Config::from_custom_kubeconfig(file, &Default::default()).await {
        Ok(config) => config,
        Err(e) if e.to_string().to_lowercase().contains("certificate") => {
            return State::BadCa(e.to_string())
        }
        Err(e) => return State::Unusable(format!("not a usable kubeconfig: {e}")),
    };
    let server = config.cluster_url.to_string();
    let client = match kube::Client::try_from(config) {
        Ok(client) => client,
        Err(e) => return State::BadCa(format!("no TLS client from it: {e}")),
    };
    match tokio::time::timeout(ASK_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(_)) => State::Accepted { server },
        Ok(Err(kube::Error::Api(status))) if status.code == 401 => State::Rejected {
            server,
            message: format!("{} {}", status.code, status.message),
        },
        // Forbidden or not found: the token was authenticated first.
        Ok(Err(kube::Error::Api(status))) if [403, 404].contains(&status.code) => {
            State::Accepted { server }
        }
        Ok(Err(kube::Error::Api(status))) => State::Unreachable {
            server,
            why: format!("it answers {} {}", status.code, status.message),
            expires,
        },
        Ok(Err(e)) => State::Unreachable {
            server,
            why: e.to_string(),
            expires,
        },
        Err(_) => State::Unreachable {
            server,
            why: format!("no answer within {} s", ASK_TIMEOUT.as_secs()),
            expires,
        },
    }
}

/// `2024-05-01T10:00:00Z`.
pub fn when(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

/// `3 days`, `5 h`, `40 min`.
pub fn ago(secs: u64) -> String {
    match secs {
        s if s >= 2 * 86400 => format!("{} days", s / 86400),
        s if s >= 2 * 3600 => format!("{} h", s / 3600),
        s => format!("{} min", s / 60),
    }
}

#[cfg(test)]
mod tests {
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::doctor::{calico::check_credentials, Status};

    const NOW: u64 = 1_750_000_000;

    /// A service account JWT as the API issues them (the signature is not
    /// checked offline).
    fn jwt(exp: u64) -> String {
        let part = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
        format!(
            "{}.{}.c2lnbmF0dXJl",
            part(serde_json::json!({"alg": "RS256", "kid": "k"})),
            part(serde_json::json!({"iss": "https://kubernetes.default.svc",
                "sub": "system:serviceaccount:kube-system:calico-cni-plugin",
                "iat": exp - 86400, "exp": exp}))
        )
    }

    /// install-cni's kubeconfig shape.
    fn kubeconfig(server: &str, token: &str, ca: Option<&str>) -> String {
        let ca = ca.map_or(String::new(), |ca| {
            format!(
                "\n    certificate-authority-data: \"{}\"",
                STANDARD.encode(ca)
            )
        });
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}{ca}\nusers:\n- name: calico\n  user:\n    token: {token}\ncontexts:\n- name: calico-context\n  context:\n    cluster: local\n    user: calico\ncurrent-context: calico-context\n")
    }

    fn told(state: State) -> Check {
        let file = format!("/etc/cni/net.d/{CNI_KUBECONFIG}");
        check_credentials("node-2", &Credentials { file, state })
    }

    use crate::doctor::Check;

    /// A port nothing listens on.
    async fn closed_port() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    }

    #[test]
    fn a_tokens_exp_is_read_from_its_payload() {
        assert_eq!(expiry(&jwt(NOW)), Some(NOW));
        assert_eq!(expiry("an-expired-token"), None);
        assert_eq!(expiry("a.bm90IGpzb24.c"), None);
    }

    #[tokio::test]
    async fn an_expired_token_is_told_with_no_api_at_all() {
        // An address that would hang if asked: the verdict comes first.
        let text = kubeconfig("https://192.0.2.1:6443", &jwt(NOW - 3 * 86400), None);
        let state = judge(&text, NOW).await;
        assert_eq!(
            state,
            State::Expired {
                exp: NOW - 3 * 86400,
                now: NOW
            }
        );
        let check = told(state);
        assert!(check.failed());
        assert!(
            check
                .evidence
                .contains("token expired since 2025-06-12T15:06:40Z (3 days ago"),
            "{}",
            check.evidence
        );
        assert!(!check.evidence.contains("rejected"), "{}", check.evidence);
        assert!(check.fix.unwrap().contains("restart calico-node on node-2"));
    }

    #[tokio::test]
    async fn an_api_that_does_not_answer_never_rejects_a_valid_token() {
        let server = format!("http://127.0.0.1:{}", closed_port().await);
        let state = judge(&kubeconfig(&server, &jwt(NOW + 3600), None), NOW).await;
        assert!(matches!(state, State::Unreachable { .. }), "{state:?}");
        let check = told(state);
        assert_eq!(check.status, Status::NotChecked);
        assert!(
            check
                .evidence
                .starts_with("not checked: the API at http://127.0.0.1:"),
            "{}",
            check.evidence
        );
        assert!(check.evidence.contains("valid until"), "{}", check.evidence);
        for never in ["rejected", "Unauthorized"] {
            assert!(!check.evidence.contains(never), "{}", check.evidence);
        }
    }

    #[tokio::test]
    async fn a_ca_that_does_not_parse_is_its_own_finding() {
        let bad = "-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n";
        let server = format!("https://127.0.0.1:{}", closed_port().await);
        let state = judge(&kubeconfig(&server, &jwt(NOW + 3600), Some(bad)), NOW).await;
        assert!(matches!(state, State::BadCa(_)), "{state:?}");
        let check = told(state);
        assert!(check.failed());
        assert!(
            check.evidence.contains("CA does not parse"),
            "{}",
            check.evidence
        );
        assert!(!check.evidence.contains("rejected"), "{}", check.evidence);
    }

    /// An API that answers every request 401, as kube-apiserver does to a
    /// token it does not accept.
    async fn refusing_api() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let body = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#;
                let answer = format!("HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        format!("http://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn only_a_401_says_rejected() {
        let server = refusing_api().await;
        let state = judge(&kubeconfig(&server, &jwt(NOW + 3600), None), NOW).await;
        assert!(matches!(state, State::Rejected { .. }), "{state:?}");
        let check = told(state);
        assert!(check.failed());
        assert!(
            check
                .evidence
                .contains("token is rejected: the API at http://127.0.0.1:")
                && check.evidence.contains("answers 401 Unauthorized")
                && check
                    .evidence
                    .contains("connection is unauthorized: Unauthorized"),
            "{}",
            check.evidence
        );
    }
}
