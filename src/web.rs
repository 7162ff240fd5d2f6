//! The metrics endpoint's HTTP server: HTTP/1.1 on a current-thread tokio runtime on its own
//! thread (the daemon's event loop does no HTTP work), optionally over TLS (rustls) and behind
//! basic auth, configured by the web configuration file Prometheus exporters share
//! (exporter-toolkit's `web-config.yml`: `tls_server_config`, `http_server_config.headers`,
//! `basic_auth_users` with bcrypt hashes). Options of that format dbcage does not implement are
//! refused by name rather than ignored, so that nobody believes a setting is in force that is not.
//!
//! It owns the listening socket and the decision who may read; what is served comes from the
//! caller (`metrics::serve`). It never binds off loopback without a web configuration unless told
//! to (`--metrics-insecure`).

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tokio_rustls::rustls;

/// The web configuration file as written (exporter-toolkit's format).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebConfig {
    #[serde(default)]
    pub tls_server_config: Option<TlsServerConfig>,
    #[serde(default)]
    pub http_server_config: Option<HttpServerConfig>,
    /// user -> bcrypt hash.
    #[serde(default)]
    pub basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsServerConfig {
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// PEM text inline, instead of `cert_file`.
    pub cert: Option<String>,
    /// PEM text inline, instead of `key_file`.
    pub key: Option<String>,
    #[serde(default)]
    pub client_auth_type: Option<String>,
    pub client_ca_file: Option<PathBuf>,
    pub client_ca: Option<String>,
    pub min_version: Option<String>,
    pub max_version: Option<String>,
    // Accepted so that a file written for another exporter is refused with a reason, below.
    pub cipher_suites: Option<Vec<String>>,
    pub curve_preferences: Option<Vec<String>>,
    pub prefer_server_cipher_suites: Option<bool>,
    pub client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpServerConfig {
    /// HTTP/2 is not served (Prometheus scrapes over HTTP/1.1); accepted and has no effect.
    pub http2: Option<bool>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

/// Headers `http_server_config.headers` may set (the list exporter-toolkit accepts).
const ALLOWED_HEADERS: [&str; 5] = [
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
];

/// What the server enforces, checked and loaded from a `WebConfig`.
pub struct Settings {
    tls: Option<Arc<rustls::ServerConfig>>,
    users: BTreeMap<String, String>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Settings {
    /// Whether the endpoint speaks TLS.
    pub fn tls(&self) -> bool {
        self.tls.is_some()
    }
}

impl WebConfig {
    /// Reads and parses `path`; relative file names in it are relative to its directory.
    pub fn load(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the web configuration {}", path.display()))?;
        let config: WebConfig = serde_saphyr::from_str(&text)
            .map_err(|e| anyhow::anyhow!("web configuration {}: {e}", path.display()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        config
            .settings(dir)
            .with_context(|| format!("web configuration {}", path.display()))
    }

    fn settings(self, dir: &Path) -> Result<Settings> {
        for (user, hash) in &self.basic_auth_users {
            if user.contains(':') || user.is_empty() {
                bail!("basic_auth_users: `{user}` is not a user name (empty, or contains `:`)");
            }
            if hash.parse::<bcrypt::HashParts>().is_err() {
                bail!("basic_auth_users.{user}: not a bcrypt hash (make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)");
            }
        }
        let mut headers = Vec::new();
        if let Some(h) = &self.http_server_config {
            for (name, value) in &h.headers {
                if !ALLOWED_HEADERS.iter().any(|a| a.eq_ignore_ascii_case(name)) {
                    bail!(
                        "http_server_config.headers: `{name}` is not one of {}",
                        ALLOWED_HEADERS.join(", ")
                    );
                }
                headers.push((
                    HeaderName::from_bytes(name.as_bytes())?,
                    HeaderValue::from_str(value).with_context(|| {
                        format!("http_server_config.headers.{name}: not a header value")
                    })?,
                ));
            }
        }
        let tls = self
            .tls_server_config
            .map(|t| t.server_config(dir))
            .transpose()
            .context("tls_server_config")?;
        Ok(Settings {
            tls,
            users: self.basic_auth_users,
            headers,
        })
    }
}

/// PEM text from a file (relative to the configuration's directory) or given inline.
fn pem(dir: &Path, file: &Option<PathBuf>, inline: &Option<String>, what: &str) -> Result<Vec<u8>> {
    match (file, inline) {
        (Some(_), Some(_)) => bail!("both {what}_file and {what} are set; use one"),
        (Some(f), None) => {
            let f = dir.join(f);
            std::fs::read(&f).with_context(|| format!("cannot read {what}_file {}", f.display()))
        }
        (None, Some(text)) => Ok(text.as_bytes().to_vec()),
        (None, None) => bail!("{what}_file is missing"),
    }
}

fn tls_version(v: &str, key: &str) -> Result<u8> {
    match v {
        "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        "TLS10" | "TLS11" => bail!("{key}: {v} is not supported (rustls speaks TLS 1.2 and 1.3)"),
        _ => bail!("{key}: `{v}` is not a TLS version; use TLS12 or TLS13"),
    }
}

impl TlsServerConfig {
    fn server_config(self, dir: &Path) -> Result<Arc<rustls::ServerConfig>> {
        use rustls_pki_types::pem::PemObject;
        use rustls_pki_types::{CertificateDer, PrivateKeyDer};
        for (set, key) in [
            (self.cipher_suites.is_some(), "cipher_suites"),
            (self.curve_preferences.is_some(), "curve_preferences"),
            (
                self.prefer_server_cipher_suites.is_some(),
                "prefer_server_cipher_suites",
            ),
            (self.client_allowed_sans.is_some(), "client_allowed_sans"),
        ] {
            if set {
                bail!("{key} is not supported by dbcage (rustls' safe defaults apply); remove it");
            }
        }
        let cert_pem = pem(dir, &self.cert_file, &self.cert, "cert")?;
        let key_pem = pem(dir, &self.key_file, &self.key, "key")?;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .context("cert: not PEM certificates")?;
        if certs.is_empty() {
            bail!("cert: no certificate in it");
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).context("key: no PEM private key")?;
        let min = tls_version(
            self.min_version.as_deref().unwrap_or("TLS12"),
            "min_version",
        )?;
        let max = tls_version(
            self.max_version.as_deref().unwrap_or("TLS13"),
            "max_version",
        )?;
        if min > max {
            bail!("min_version is above max_version");
        }
        let versions: Vec<&'static rustls::SupportedProtocolVersion> =
            [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
                .into_iter()
                .filter(|(v, _)| (min..=max).contains(v))
                .map(|(_, p)| p)
                .collect();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .context("TLS versions")?;
        let client_auth = self.client_auth_type.as_deref().unwrap_or("NoClientCert");
        let builder = match client_auth {
            "NoClientCert" => builder.with_no_client_auth(),
            "RequireAndVerifyClientCert" | "VerifyClientCertIfGiven" => {
                let ca_pem = pem(dir, &self.client_ca_file, &self.client_ca, "client_ca")?;
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(&ca_pem) {
                    roots
                        .add(c.context("client_ca: not PEM certificates")?)
                        .context("client_ca")?;
                }
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider);
                let verifier = if client_auth == "VerifyClientCertIfGiven" {
                    verifier.allow_unauthenticated()
                } else {
                    verifier
                };
                builder.with_client_cert_verifier(verifier.build().context("client_ca")?)
            }
            other => bail!(
                "client_auth_type: `{other}` is not supported; use NoClientCert, RequireAndVerifyClientCert or VerifyClientCertIfGiven (the others accept unverified certificates)"
            ),
        };
        let mut config = builder
            .with_single_cert(certs, key)
            .context("cert and key do not make a pair")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Whether serving on `addr` without a web configuration would expose the endpoint beyond this
/// host: any address but loopback (a wildcard such as 0.0.0.0 or ::, or a routable one).
pub fn exposed(addr: &SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// Successful basic-auth checks already paid for (bcrypt costs tens of milliseconds by design),
/// keyed by a digest of user, password and hash; bounded.
struct AuthCache {
    passed: Mutex<HashSet<[u8; 32]>>,
    /// A hash checked against for unknown users, so that their refusal takes as long as a
    /// wrong password's.
    dummy: String,
}

const AUTH_CACHE_MAX: usize = 1024;

impl AuthCache {
    fn allows(&self, users: &BTreeMap<String, String>, header: Option<&HeaderValue>) -> bool {
        let Some((user, password)) = header
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Basic "))
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok())
            .and_then(|s| {
                let (u, p) = s.split_once(':')?;
                Some((u.to_string(), p.to_string()))
            })
        else {
            return false;
        };
        let Some(hash) = users.get(&user) else {
            let _ = bcrypt::verify(&password, &self.dummy);
            return false;
        };
        let key: [u8; 32] = Sha256::new()
            .chain_update(user.as_bytes())
            .chain_update([0])
            .chain_update(password.as_bytes())
            .chain_update([0])
            .chain_update(hash.as_bytes())
            .finalize()
            .into();
        if self
            .passed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&key)
        {
            return true;
        }
        let ok = bcrypt::verify(&password, hash).unwrap_or(false);
        if ok {
            let mut cache = self.passed.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= AUTH_CACHE_MAX {
                cache.clear();
            }
            cache.insert(key);
        }
        ok
    }
}

/// How long a client may take to finish its TLS handshake or send its request head.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the server answers: the path and the request's Accept header give a content type and
/// a body, or None for "not found".
pub type Handler = dyn Fn(&str, Option<&str>) -> Option<(&'static str, String)> + Send + Sync;

/// Binds `addr` now (so that a taken port is reported at start) and serves from a thread named
/// `metrics`.
pub fn serve(addr: SocketAddr, settings: Option<Settings>, handler: Arc<Handler>) -> Result<()> {
    let settings = settings.unwrap_or(Settings {
        tls: None,
        users: BTreeMap::new(),
        headers: Vec::new(),
    });
    let listener =
        std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    listener.set_nonblocking(true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the metrics server's runtime")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(accept_loop(listener, settings, handler)))?;
    Ok(())
}

async fn accept_loop(listener: std::net::TcpListener, settings: Settings, handler: Arc<Handler>) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::warn!("metrics: {e}"),
    };
    let tls = settings.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    // The dummy costs what the users' hashes cost.
    let cost = settings
        .users
        .values()
        .filter_map(|h| h.parse::<bcrypt::HashParts>().ok())
        .map(|p| p.get_cost())
        .max()
        .unwrap_or(4);
    let auth = AuthCache {
        passed: Mutex::new(HashSet::new()),
        dummy: bcrypt::hash("dbcage: no such user", cost).unwrap_or_default(),
    };
    let shared = Arc::new((settings, auth, handler));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&shared, &req)) }
            });
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(CLIENT_TIMEOUT);
            let result = match tls {
                Some(acceptor) => {
                    match tokio::time::timeout(CLIENT_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            http.serve_connection(hyper_util::rt::TokioIo::new(s), service)
                                .await
                        }
                        Ok(Err(e)) => {
                            return tracing::debug!(%peer, "metrics: TLS handshake failed: {e}")
                        }
                        Err(_) => return tracing::debug!(%peer, "metrics: TLS handshake timed out"),
                    }
                }
                None => {
                    http.serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "metrics: {e}");
            }
        });
    }
}

type Shared = (Settings, AuthCache, Arc<Handler>);

fn respond(shared: &Shared, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let (settings, auth, handler) = shared;
    let mut response = if !settings.users.is_empty()
        && !auth.allows(
            &settings.users,
            req.headers().get(hyper::header::AUTHORIZATION),
        ) {
        let mut r = Response::new(Full::new(Bytes::from_static(b"Unauthorized\n")));
        *r.status_mut() = StatusCode::UNAUTHORIZED;
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic"),
        );
        r
    } else {
        let accept = req
            .headers()
            .get(hyper::header::ACCEPT)
            .and_then(|a| a.to_str().ok());
        match handler(req.uri().path(), accept) {
            Some((content_type, body)) => {
                let mut r = Response::new(Full::new(Bytes::from(body)));
                r.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    HeaderValue::from_static(content_type),
                );
                r
            }
            None => {
                let mut r = Response::new(Full::new(Bytes::from_static(
                    b"dbcage: metrics are at /metrics\n",
                )));
                *r.status_mut() = StatusCode::NOT_FOUND;
                r
            }
        }
    };
    for (k, v) in &settings.headers {
        response.headers_mut().insert(k.clone(), v.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Settings> {
        let c: WebConfig = serde_saphyr::from_str(yaml).map_err(|e| anyhow::anyhow!("{e}"))?;
        c.settings(Path::new("/nonexistent"))
    }

    fn err(yaml: &str) -> String {
        match parse(yaml) {
            Ok(_) => panic!("accepted:\n{yaml}"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn users_and_headers_are_checked() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let s = parse(&format!(
            "basic_auth_users:\n  prometheus: '{hash}'\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        ))
        .unwrap();
        assert!(!s.tls());
        assert_eq!(s.users.len(), 1);
        assert_eq!(s.headers.len(), 1);
        assert!(err("basic_auth_users:\n  prometheus: secret\n").contains("not a bcrypt hash"));
        assert!(err("http_server_config:\n  headers:\n    Server: x\n")
            .contains("`Server` is not one of"));
        assert!(err("basic_auth_user:\n  a: b\n").contains("basic_auth_user"));
        assert!(err("rate_limit:\n  interval: 1s\n").contains("rate_limit"));
    }

    #[test]
    fn tls_options_dbcage_does_not_implement_are_refused_by_name() {
        let e = err("tls_server_config:\n  cert_file: a.pem\n  key_file: k.pem\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n");
        assert!(e.contains("cipher_suites is not supported"), "{e}");
        let e = err("tls_server_config:\n  cert_file: a.pem\n  key_file: k.pem\n");
        assert!(
            e.contains("cannot read cert_file /nonexistent/a.pem"),
            "{e}"
        );
        let e = err("tls_server_config:\n  key_file: k.pem\n");
        assert!(e.contains("cert_file is missing"), "{e}");
        assert!(tls_version("TLS11", "min_version").is_err());
        assert_eq!(tls_version("TLS13", "max_version").unwrap(), 13);
    }

    #[test]
    fn basic_auth_accepts_the_right_password_only() {
        let hash = bcrypt::hash("secret", 4).unwrap();
        let users: BTreeMap<String, String> = [("prom".to_string(), hash)].into();
        let auth = AuthCache {
            passed: Mutex::new(HashSet::new()),
            dummy: bcrypt::hash("x", 4).unwrap(),
        };
        let header = |user_pass: &str| {
            HeaderValue::from_str(&format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(user_pass)
            ))
            .unwrap()
        };
        assert!(auth.allows(&users, Some(&header("prom:secret"))));
        assert!(auth.allows(&users, Some(&header("prom:secret"))), "cached");
        assert!(!auth.allows(&users, Some(&header("prom:wrong"))));
        assert!(!auth.allows(&users, Some(&header("other:secret"))));
        assert!(!auth.allows(&users, Some(&header("promsecret"))));
        assert!(!auth.allows(&users, None));
        assert!(!auth.allows(&users, Some(&HeaderValue::from_static("Bearer x"))));
    }

    #[test]
    fn only_loopback_is_unexposed() {
        for (addr, exposed_) in [
            ("127.0.0.1:9477", false),
            ("[::1]:9477", false),
            ("0.0.0.0:9477", true),
            ("[::]:9477", true),
            ("10.1.2.3:9477", true),
        ] {
            assert_eq!(exposed(&addr.parse().unwrap()), exposed_, "{addr}");
        }
    }
}
