//! Who may use the server: API keys on every endpoint but the page and `/health`, an origin
//! check for browsers, and a bound on the sessions and requests one key (or, without keys, one
//! address) holds at once.
//!
//! A key comes as `Authorization: Bearer KEY` (the OpenAI clients), or, from a browser, whose
//! WebSocket cannot set headers, as the subprotocol `openai-insecure-api-key.KEY` (the
//! Realtime API's convention, used by SpecVoice's page too). A page from another origin may not
//! connect unless its origin is listed: a page on any site could otherwise drive a server on
//! the user's machine (cross-site WebSocket hijacking).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::openai::ApiError;
use super::Shared;

/// The subprotocol prefix a browser names its key with.
pub const KEY_SUBPROTOCOL: &str = "openai-insecure-api-key.";

/// Who a request comes from: the key it presented, or its address when the server needs none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Client {
    Key(Arc<str>),
    Address(IpAddr),
}

/// The server's keys, allowed origins, and what each client holds now.
pub(crate) struct Access {
    keys: Vec<Arc<str>>,
    origins: Vec<String>,
    per_client: usize,
    held: Mutex<HashMap<Client, usize>>,
}

impl Access {
    pub fn new(keys: &[String], origins: &[String], per_client: usize) -> Arc<Self> {
        Arc::new(Self {
            keys: keys.iter().map(|k| Arc::from(k.as_str())).collect(),
            origins: origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            per_client,
            held: Mutex::default(),
        })
    }

    /// The client of a request, or why it may not go on.
    fn admit(&self, headers: &HeaderMap, peer: IpAddr) -> Result<Client, ApiError> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin.to_str().unwrap_or("").to_ascii_lowercase();
            if !self.origin_allowed(&origin, headers) {
                return Err(ApiError::forbidden(format!(
                    "pages from the origin `{origin}` may not use this server"
                )));
            }
        }
        if self.keys.is_empty() {
            return Ok(Client::Address(peer));
        }
        let presented = bearer(headers).or_else(|| subprotocol_key(headers));
        match presented.and_then(|p| self.keys.iter().find(|k| k.as_ref() == p)) {
            Some(key) => Ok(Client::Key(Arc::clone(key))),
            None if presented.is_none() => Err(ApiError::unauthorized(
                "no API key: send `Authorization: Bearer KEY`",
            )),
            None => Err(ApiError::unauthorized("incorrect API key")),
        }
    }

    /// The server's own origin (same host and port as the request's `Host`), or a listed one.
    fn origin_allowed(&self, origin: &str, headers: &HeaderMap) -> bool {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .map(str::to_ascii_lowercase);
        let own = host.is_some_and(|host| {
            origin
                .split_once("://")
                .is_some_and(|(_, authority)| authority == host)
        });
        own || self.origins.iter().any(|o| o == origin)
    }

    /// Holds one of the client's places until the returned guard drops; an error when the
    /// client holds them all.
    pub fn hold(self: &Arc<Self>, client: &Client) -> Result<Held, ApiError> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(client.clone()).or_insert(0);
        if *count >= self.per_client {
            return Err(ApiError::rate_limited(format!(
                "this client already has {} sessions or requests in progress",
                self.per_client
            )));
        }
        *count += 1;
        Ok(Held {
            access: Arc::clone(self),
            client: client.clone(),
        })
    }
}

/// A place a client holds (a session, a request in progress).
pub(crate) struct Held {
    access: Arc<Access>,
    client: Client,
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.access.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
}

fn subprotocol_key(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(KEY_SUBPROTOCOL))
}

/// The middleware in front of every endpoint but the page and `/health`: a request without a
/// valid key gets 401, one from a foreign page 403, and nothing is done for either.
pub(crate) async fn require_access(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    match shared.access.admit(request.headers(), peer.ip()) {
        Ok(client) => {
            request.extensions_mut().insert(client);
            next.run(request).await
        }
        Err(error) => {
            shared.metrics.refused();
            error.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, StatusCode};

    use super::*;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
        }
        map
    }

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[test]
    fn keys_come_as_bearer_or_subprotocol_and_others_are_refused() {
        let access = Access::new(&["k1".into(), "k2".into()], &[], 2);
        let bearer = headers(&[(header::AUTHORIZATION, "Bearer k2")]);
        assert_eq!(
            access.admit(&bearer, PEER).unwrap(),
            Client::Key("k2".into())
        );
        let browser = headers(&[(
            header::SEC_WEBSOCKET_PROTOCOL,
            "realtime, openai-insecure-api-key.k1",
        )]);
        assert_eq!(
            access.admit(&browser, PEER).unwrap(),
            Client::Key("k1".into())
        );
        for refused in [
            headers(&[]),
            headers(&[(header::AUTHORIZATION, "Bearer k3")]),
            headers(&[(header::AUTHORIZATION, "Basic k1")]),
            headers(&[(header::SEC_WEBSOCKET_PROTOCOL, "openai-insecure-api-key.")]),
        ] {
            let error = access.admit(&refused, PEER).unwrap_err();
            assert_eq!(error.status, StatusCode::UNAUTHORIZED);
        }
        let open = Access::new(&[], &[], 2);
        assert_eq!(
            open.admit(&headers(&[]), PEER).unwrap(),
            Client::Address(PEER)
        );
    }

    #[test]
    fn pages_of_other_origins_are_refused_unless_listed() {
        let access = Access::new(&[], &["https://app.example.com/".into()], 2);
        let page =
            |origin: &str| headers(&[(header::HOST, "localhost:8080"), (header::ORIGIN, origin)]);
        assert!(access.admit(&page("http://localhost:8080"), PEER).is_ok());
        assert!(access.admit(&page("https://app.example.com"), PEER).is_ok());
        for foreign in ["http://evil.example", "http://localhost:9090", "null"] {
            let error = access.admit(&page(foreign), PEER).unwrap_err();
            assert_eq!(error.status, StatusCode::FORBIDDEN, "{foreign}");
        }
    }

    #[test]
    fn a_client_holds_at_most_its_places() {
        let access = Access::new(&[], &[], 2);
        let client = Client::Address(PEER);
        let first = access.hold(&client).unwrap();
        let _second = access.hold(&client).unwrap();
        let error = access.hold(&client).err().unwrap();
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        // Another client has places of its own.
        assert!(access.hold(&Client::Key("other".into())).is_ok());
        drop(first);
        assert!(access.hold(&client).is_ok());
    }
}
