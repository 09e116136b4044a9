//! Accepting connections, in front of the router: what a slow or greedy client can hold is
//! bounded before any request is read. A request's head must arrive within the handshake
//! deadline (a client trickling its headers, slow-loris, holds its connection no longer), one
//! address has at most so many connections open (more are answered 429 and closed at once),
//! and replies go out without Nagle's delay (the server streams small messages that must not
//! wait). A request's body has its own deadline ([`body_in_time`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower_service::Service;

use super::access::{Place, PlacesPerKey};
use super::openai::ApiError;
use super::Shared;

/// What the accept loop bounds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Longest wait for a request's head (the first, and each next on a kept-alive connection).
    pub handshake: Duration,
    /// Most connections one address has open.
    pub per_address: usize,
}

/// The answer to a connection over its address's bound, written without reading the request.
const TOO_MANY_CONNECTIONS: &[u8] = b"HTTP/1.1 429 Too Many Requests\r\nconnection: close\r\n\
content-type: text/plain\r\ncontent-length: 39\r\n\r\ntoo many connections from this address\n";

/// How long the loop pauses when accepting fails (out of file descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// Serves `router` on `listener` until `shutdown` turns `true`; then stops accepting, lets
/// every connection finish the request it is in, and returns once they have (an upgraded
/// WebSocket lives on outside: the server counts those itself).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let open = PlacesPerKey::<IpAddr>::default();
    let (closing, closed) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|down| *down) => break,
        };
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accepting a connection: {e}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Some(place) = open.take(&peer.ip(), limits.per_address) else {
            tracing::debug!("{peer}: over {} connections, refused", limits.per_address);
            // A client that does not read gets nothing: the socket never blocks this loop.
            let _ = stream.try_write(TOO_MANY_CONNECTIONS);
            continue;
        };
        let _ = stream.set_nodelay(true);
        connections.spawn(connection(
            stream,
            peer,
            router.clone(),
            limits.handshake,
            (closed.clone(), place),
        ));
    }
    drop(listener);
    closing.send_replace(true);
    while connections.join_next().await.is_some() {}
}

/// Serves one TCP connection: HTTP/1.1 with upgrades, the peer's address for the handlers.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    handshake: Duration,
    (mut closing, _place): (watch::Receiver<bool>, Place<IpAddr>),
) {
    let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(peer));
        let mut router = router.clone();
        async move { router.call(request).await }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(handshake);
    let served = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::pin!(served);
    let closed = async {
        let _ = closing.wait_for(|down| *down).await;
    };
    let result = tokio::select! {
        result = served.as_mut() => result,
        () = closed => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(e) = result {
        tracing::debug!("{peer}: {e}");
    }
}

/// The middleware that reads a request's body within the body deadline before the handler
/// runs (a client trickling an upload holds its connection no longer); 408 when it does not
/// arrive in time, 413 when it is longer than the server takes.
pub(crate) async fn body_in_time(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::GET {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let config = &shared.config;
    let read = tokio::time::timeout(
        config.body_timeout,
        axum::body::to_bytes(body, config.max_body_bytes),
    )
    .await;
    match read {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let too_long = std::error::Error::source(&e)
                .is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            match too_long {
                true => ApiError::too_large(format!(
                    "the request body is longer than {} bytes",
                    config.max_body_bytes
                )),
                false => ApiError::invalid(format!("reading the request body: {e}")),
            }
            .into_response()
        }
        Err(_) => ApiError::timeout(format!(
            "the request body did not arrive within {} s",
            config.body_timeout.as_secs_f64()
        ))
        .into_response(),
    }
}
