//! Who may use the server: API keys on every endpoint but the page and `/health`, an origin
//! check for browsers, and bounds on what one key (or, without keys, one address) does: the
//! sessions and requests it holds at once, and the requests it makes a minute.
//!
//! A key comes as `Authorization: Bearer KEY` (the OpenAI clients), or, from a browser, whose
//! WebSocket cannot set headers, as the subprotocol `openai-insecure-api-key.KEY` (the
//! Realtime API's convention, used by SpecVoice's page too). A page from another origin may not
//! connect unless its origin is listed: a page on any site could otherwise drive a server on
//! the user's machine (cross-site WebSocket hijacking).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// Clients whose request budgets are tracked at the most: beyond, the full ones are forgotten
/// (a full budget is what a new client gets anyway), then the longest idle.
const TRACKED_CLIENTS: usize = 1024;

/// A token bucket: `rate` tokens a second, at most `burst` saved; each message or request
/// takes one.
#[derive(Clone, Debug)]
pub(crate) struct Budget {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Budget {
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst,
            tokens: burst,
            last: Instant::now(),
        }
    }

    /// Takes a token if there is one.
    pub fn take(&mut self) -> bool {
        self.take_at(Instant::now())
    }

    fn take_at(&mut self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.last = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    fn full_at(&self, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens + earned >= self.burst
    }
}

/// Places held per key (connections per address, sessions and requests per client), at most a
/// bound each; a place is given back when its [`Place`] drops.
pub(crate) struct PlacesPerKey<K: Eq + Hash>(Arc<Mutex<HashMap<K, usize>>>);

impl<K: Eq + Hash> Default for PlacesPerKey<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K: Clone + Eq + Hash> PlacesPerKey<K> {
    /// One of `key`'s places, unless it holds `bound` already.
    pub fn take(&self, key: &K, bound: usize) -> Option<Place<K>> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = held.entry(key.clone()).or_insert(0);
        if *count >= bound {
            return None;
        }
        *count += 1;
        Some(Place {
            places: Arc::clone(&self.0),
            key: key.clone(),
        })
    }
}

/// A place one key holds, counted while it lives.
pub(crate) struct Place<K: Eq + Hash> {
    places: Arc<Mutex<HashMap<K, usize>>>,
    key: K,
}

impl<K: Eq + Hash> Drop for Place<K> {
    fn drop(&mut self) {
        let mut held = self.places.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}

/// The server's keys, allowed origins, and what each client holds and spends now.
pub(crate) struct Access {
    keys: Vec<Arc<str>>,
    origins: Vec<String>,
    per_client: usize,
    held: PlacesPerKey<Client>,
    requests_per_minute: u32,
    budgets: Mutex<HashMap<Client, Budget>>,
}

impl Access {
    pub fn new(
        keys: &[String],
        origins: &[String],
        per_client: usize,
        requests_per_minute: u32,
    ) -> Arc<Self> {
        Arc::new(Self {
            keys: keys.iter().map(|k| Arc::from(k.as_str())).collect(),
            origins: origins
                .iter()
                .map(|o| o.trim_end_matches('/').to_ascii_lowercase())
                .collect(),
            per_client,
            held: PlacesPerKey::default(),
            requests_per_minute,
            budgets: Mutex::default(),
        })
    }

    /// Spends one of the client's requests of the minute (bursts of up to a tenth of the
    /// minute's); an error when none is left.
    fn spend_request(&self, client: &Client) -> Result<(), ApiError> {
        let per_minute = f64::from(self.requests_per_minute);
        let now = Instant::now();
        let mut budgets = self.budgets.lock().unwrap_or_else(|e| e.into_inner());
        if budgets.len() >= TRACKED_CLIENTS && !budgets.contains_key(client) {
            budgets.retain(|_, budget| !budget.full_at(now));
            if budgets.len() >= TRACKED_CLIENTS {
                // New clients come faster than budgets refill: forget the longest idle half
                // (they start again with the budget a new client gets).
                let mut lasts: Vec<Instant> = budgets.values().map(|b| b.last).collect();
                lasts.sort_unstable();
                let cut = lasts[lasts.len() / 2];
                budgets.retain(|_, budget| budget.last > cut);
            }
        }
        let budget = budgets
            .entry(client.clone())
            .or_insert_with(|| Budget::new(per_minute / 60.0, (per_minute / 10.0).max(1.0)));
        match budget.take_at(now) {
            true => Ok(()),
            false => Err(ApiError::rate_limited(format!(
                "more than {} requests a minute",
                self.requests_per_minute
            ))),
        }
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
    pub fn hold(&self, client: &Client) -> Result<Place<Client>, ApiError> {
        self.held.take(client, self.per_client).ok_or_else(|| {
            ApiError::rate_limited(format!(
                "this client already has {} sessions or requests in progress",
                self.per_client
            ))
        })
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
/// valid key gets 401, one from a foreign page 403, one over the client's requests a minute
/// 429, and nothing is done for any of them.
pub(crate) async fn require_access(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let admitted = shared
        .access
        .admit(request.headers(), peer.ip())
        .and_then(|client| shared.access.spend_request(&client).map(|()| client));
    match admitted {
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
        let access = Access::new(&["k1".into(), "k2".into()], &[], 2, 60);
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
        let open = Access::new(&[], &[], 2, 60);
        assert_eq!(
            open.admit(&headers(&[]), PEER).unwrap(),
            Client::Address(PEER)
        );
    }

    #[test]
    fn pages_of_other_origins_are_refused_unless_listed() {
        let access = Access::new(&[], &["https://app.example.com/".into()], 2, 60);
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
        let access = Access::new(&[], &[], 2, 60);
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

    #[test]
    fn a_budget_allows_its_burst_then_its_rate() {
        let start = Instant::now();
        let mut budget = Budget::new(10.0, 3.0);
        budget.last = start;
        assert!((0..3).all(|_| budget.take_at(start)));
        assert!(!budget.take_at(start));
        let later = start + std::time::Duration::from_millis(100);
        assert!(budget.take_at(later));
        assert!(!budget.take_at(later));
        let idle = start + std::time::Duration::from_secs(60);
        assert!(budget.full_at(idle));
        assert!((0..3).all(|_| budget.take_at(idle)));
        assert!(!budget.take_at(idle));
    }

    #[test]
    fn a_client_over_its_requests_a_minute_is_refused_and_others_are_not() {
        let access = Access::new(&[], &[], 2, 60);
        let flooding = Client::Address(PEER);
        // 60 a minute: bursts of 6.
        for _ in 0..6 {
            access.spend_request(&flooding).unwrap();
        }
        let error = access.spend_request(&flooding).unwrap_err();
        assert_eq!(error.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(access.spend_request(&Client::Key("other".into())).is_ok());
        // Many clients come and go: full budgets are forgotten, the map stays bounded.
        for i in 0..3 * TRACKED_CLIENTS as u32 {
            let address = IpAddr::V4(std::net::Ipv4Addr::from(i + 10));
            access.spend_request(&Client::Address(address)).unwrap();
        }
        assert!(access.budgets.lock().unwrap().len() <= TRACKED_CLIENTS + 1);
    }
}
