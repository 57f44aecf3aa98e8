use super::*;
fn route(path: &str, target: &str) -> GateRoute {
    GateRoute { method: "POST".into(), path: path.into(), target: target.into() }
}

fn routes() -> GateRoutes {
    GateRoutes::compile(&[
        route("/limited-drops/{dropId}/orders", "LIMITED_DROP"),
        route("/events/{id}/seats/select", "TICKETING_EVENT"),
    ])
    .unwrap()
}

fn gated(path: &str) -> Option<Result<QueueTarget, ParseError>> {
    routes().match_path(&CanonicalPath::parse(path).unwrap())
}

fn drop42() -> Option<Result<QueueTarget, ParseError>> {
    Some(Ok("LIMITED_DROP:42".parse().unwrap()))
}

#[test]
fn routes_map_to_their_targets() {
    assert_eq!(gated("/limited-drops/42/orders"), drop42());
    assert_eq!(gated("/events/7/seats/select"), Some(Ok("TICKETING_EVENT:7".parse().unwrap())));
    assert_eq!(gated("/limited-drops/42/orders/x"), None);
    assert_eq!(gated("/limited-drops/42"), None);
    assert_eq!(gated("/products/1"), None);
    assert_eq!(gated("/limited-drops/42/ordersx"), None);
    assert!(matches!(gated("/limited-drops/abc/orders"), Some(Err(_))));
}

#[test]
fn every_spelling_of_a_gated_route_is_gated() {
    for p in [
        "/limited-drops/42/orders/",
        "/limited-drops/42//orders",
        "/limited-drops//42/orders",
        "/limited-drops/42/./orders",
        "/limited-drops/x/../42/orders",
        "/./limited-drops/42/orders",
        "/limited-drops/42/orders/.",
        "/limited-drops/42/orders/x/..",
        "/LIMITED-DROPS/42/orders",
        "/limited-drops/42/Orders",
        "/limited-drops/42/%6Frders",
        "/limited-drops/42/%6frders",
        "/%6C%69mited-drops/%34%32/orders",
        "/limited-drops/42/orders.json",
        "/limited-drops/42/orders.",
        "/limited-drops/42/orders%2Ejson",
        "/limited-drops/42/orders;jsessionid=x",
        "/limited-drops;a=b/42;c/orders;d",
        "/limited-drops/42/orders%3Bx",
        "/limited-drops/42/orders%20",
        "/limited-drops/%2042/orders",
        "/limited-drop%C5%BF/42/orders",
        "/limited-drops/42/orders%E2%80%8A",
    ] {
        assert_eq!(gated(p), drop42(), "{p}");
    }
}

#[test]
fn ambiguous_spellings_are_refused() {
    for (p, e) in [
        ("/limited-drops/42/orders%2F", PathError::EncodedDelimiter("slash (%2F)")),
        ("/limited-drops%2F42%2Forders", PathError::EncodedDelimiter("slash (%2F)")),
        ("/limited-drops/42/orders%2f", PathError::EncodedDelimiter("slash (%2F)")),
        ("/limited-drops/42/orders%5C", PathError::EncodedDelimiter("backslash (%5C)")),
        ("/limited-drops/42/orders%00", PathError::EncodedDelimiter("NUL (%00)")),
        ("/limited-drops/42/orders%0A", PathError::EncodedDelimiter("control character")),
        ("/limited-drops/42/orders\\", PathError::RawCharacter("backslash")),
        ("/limited-drops/42/orders%", PathError::BadEscape),
        ("/limited-drops/42/orders%G1", PathError::BadEscape),
        ("/limited-drops/42/orders%FF", PathError::NotUtf8),
        ("/x/%2E%2E/limited-drops/42/orders", PathError::DisguisedDotSegment),
        ("/x/.%2e/limited-drops/42/orders", PathError::DisguisedDotSegment),
        ("/limited-drops/%2E/42/orders", PathError::DisguisedDotSegment),
        ("/x/..;/limited-drops/42/orders", PathError::DisguisedDotSegment),
        ("/x/..%20/limited-drops/42/orders", PathError::DisguisedDotSegment),
        ("/../limited-drops/42/orders", PathError::AboveRoot),
        ("//limited-drops/42/orders", PathError::NetworkPath),
        ("///limited-drops/42/orders", PathError::NetworkPath),
        ("//shop.example/limited-drops/42/orders", PathError::NetworkPath),
        ("//", PathError::NetworkPath),
        ("/limited-drops/42/orders%23", PathError::EncodedDelimiter("# (%23)")),
        ("/x%23/../limited-drops/42/orders", PathError::EncodedDelimiter("# (%23)")),
        ("/x#/../limited-drops/42/orders", PathError::RawCharacter("#")),
        ("/limited-drops/42/orders#", PathError::RawCharacter("#")),
        ("limited-drops/42/orders", PathError::NotAbsolute),
        ("*", PathError::NotAbsolute),
    ] {
        assert_eq!(CanonicalPath::parse(p), Err(e), "{p}");
    }
}

#[test]
fn the_forwarded_path_is_the_one_checked() {
    let fwd = |p: &str| CanonicalPath::parse(p).unwrap().as_str().to_owned();
    assert_eq!(fwd("/limited-drops/x/../42//./orders"), "/limited-drops/42/orders");
    assert_eq!(fwd("/limited-drops/42/%6frders"), "/limited-drops/42/orders");
    assert_eq!(fwd("/a/%c3%a9/b%3bc"), "/a/%C3%A9/b%3Bc");
    assert_eq!(fwd("/products/"), "/products/");
    assert_eq!(fwd("/products/x/.."), "/products/");
    assert_eq!(fwd("/"), "/");
    assert_eq!(fwd("/a;b=c/d"), "/a;b=c/d");
}

#[test]
fn the_queue_api_is_recognised_however_spelt() {
    for p in ["/virtual-queues/x", "/VIRTUAL-QUEUES/x", "/./virtual-queues", "/virtual-queues;x/y"] {
        assert!(CanonicalPath::parse(p).unwrap().is_queue_api(), "{p}");
    }
    assert!(!CanonicalPath::parse("/products/virtual-queues").unwrap().is_queue_api());
}

#[test]
fn bad_route_config_is_refused() {
    let bad = |path: &str, target: &str| GateRoutes::compile(&[route(path, target)]).map(|_| ());
    assert_eq!(bad("/a/{id}/b", "LIMITED_DROP"), Ok(()));
    assert!(matches!(bad("/a/b", "LIMITED_DROP"), Err(RouteError::NotOneId { .. })));
    assert!(matches!(bad("/a/{x}/{y}", "LIMITED_DROP"), Err(RouteError::NotOneId { .. })));
    assert_eq!(
        bad("/a/{x}", "CONCERT"),
        Ok(()),
        "any well-formed type: the configuration checks it is one of its types"
    );
    assert!(matches!(bad("/a/{x}", "Concert"), Err(RouteError::Target(_))));
    assert!(matches!(bad("a/{x}", "LIMITED_DROP"), Err(RouteError::NotAbsolute { .. })));
    let err = bad("/a/{x}/b.json", "LIMITED_DROP").unwrap_err();
    assert_eq!(err.to_string(), "path `/a/{x}/b.json`: segment `b.json` must be letters, digits, - _ ~");
    assert!(matches!(bad("/a//{x}", "LIMITED_DROP"), Err(RouteError::BadSegment { .. })));
}
