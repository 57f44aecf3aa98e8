//! Which requests the gate guards: a table of routes compiled once from `gate.routes`. Pure.

use crate::config::GateRoute;
use crate::domain::{ParseError, QueueTarget, QueueTargetType};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Id,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Compiled {
    method: String,
    segments: Vec<Segment>,
    kind: QueueTargetType,
}

/// The gated routes, matched against a request's method and path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateRoutes(Vec<Compiled>);

impl GateRoutes {
    pub fn compile(routes: &[GateRoute]) -> Result<Self, String> {
        let mut out = Vec::with_capacity(routes.len());
        for r in routes {
            let kind = QueueTargetType::parse_any(&r.target).map_err(|e| e.to_string())?;
            if !r.path.starts_with('/') {
                return Err(format!("path `{}` must start with /", r.path));
            }
            let segments: Vec<Segment> =
                r.path
                    .trim_start_matches('/')
                    .split('/')
                    .map(|s| {
                        if s.starts_with('{') && s.ends_with('}') {
                            Segment::Id
                        } else {
                            Segment::Literal(s.to_owned())
                        }
                    })
                    .collect();
            if segments.iter().filter(|s| **s == Segment::Id).count() != 1 {
                return Err(format!("path `{}` needs exactly one {{id}} segment", r.path));
            }
            out.push(Compiled { method: r.method.to_ascii_uppercase(), segments, kind });
        }
        Ok(Self(out))
    }

    /// `None` when the request is not gated; otherwise the target, or why its id is invalid.
    pub fn match_request(&self, method: &str, path: &str) -> Option<Result<QueueTarget, ParseError>> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        self.0.iter().find_map(|route| {
            if !route.method.eq_ignore_ascii_case(method) || route.segments.len() != parts.len() {
                return None;
            }
            let mut id = None;
            for (seg, part) in route.segments.iter().zip(&parts) {
                match seg {
                    Segment::Literal(l) if l == part => {}
                    Segment::Literal(_) => return None,
                    Segment::Id => id = Some(*part),
                }
            }
            let id = id?;
            Some(QueueTarget::from_parts(route.kind.as_str(), id))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::GateSettings;

    fn routes() -> GateRoutes {
        GateRoutes::compile(&GateSettings::default().routes).unwrap()
    }

    #[test]
    fn default_routes_map_to_their_targets() {
        let r = routes();
        assert_eq!(r.match_request("POST", "/limited-drops/42/orders"), Some(Ok("LIMITED_DROP:42".parse().unwrap())));
        assert_eq!(r.match_request("post", "/events/7/seats/select"), Some(Ok("TICKETING_EVENT:7".parse().unwrap())));
        assert_eq!(r.match_request("GET", "/limited-drops/42/orders"), None, "other methods pass");
        assert_eq!(r.match_request("POST", "/limited-drops/42/orders/x"), None);
        assert_eq!(r.match_request("POST", "/products/1"), None);
        assert!(matches!(r.match_request("POST", "/limited-drops/abc/orders"), Some(Err(_))));
    }

    #[test]
    fn bad_route_config_is_refused() {
        let bad = |path: &str, target: &str| {
            GateRoutes::compile(&[GateRoute { method: "POST".into(), path: path.into(), target: target.into() }])
        };
        assert!(bad("/a/{id}/b", "LIMITED_DROP").is_ok());
        assert!(bad("/a/b", "LIMITED_DROP").is_err());
        assert!(bad("/a/{x}/{y}", "LIMITED_DROP").is_err());
        assert!(bad("/a/{x}", "CONCERT").is_err());
        assert!(bad("a/{x}", "LIMITED_DROP").is_err());
    }
}
