package vq.token;

import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.FilterConfig;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Locale;
import java.util.function.Function;

/**
 * A Jakarta Servlet filter (Spring Boot 3, Tomcat 10+, Jetty 11+) that checks the entry token of
 * requests to a purchase route, as vq's gate does, before the purchase API sees them.
 *
 * <p>The route is a template with one {@code {id}} segment, e.g. {@code /limited-drops/{id}/orders},
 * matched on the path the container decoded and normalised ({@code servletPath + pathInfo}) the
 * lenient way vq's gate matches {@code gate.routes}: literal segments case-insensitively (ASCII),
 * ignoring a trailing slash, {@code ;params}, surrounding whitespace and a {@code .suffix}. Other
 * paths pass unchecked, so the filter may be mapped to {@code /*}. Every method is checked.
 *
 * <p>Refusals are vq's: 403 {@code {"code":"QUEUE_BYPASS_DENIED","detail":…}}; 400
 * {@code INVALID_REQUEST} for X-User-Id or X-Entry-Token sent twice, or a target id that is not
 * a positive 64-bit integer. A passing request carries the verdict in the request attribute
 * {@link #VERDICT_ATTRIBUTE}.
 *
 * <p>The user id is the X-User-Id header by default: vq trusts it as sent, so the proxy in front
 * must set it from the login; or pass a function reading your authenticated principal. Either way
 * it is a string vq takes as a user id (1 to 128 characters, each an ASCII letter, a digit or one
 * of {@code - _ . : @ +}, compared exactly), else the request is refused with 403, as vq's gate
 * refuses it.
 *
 * <p>In web.xml without code: init params {@code type} and {@code route}; the keys come from the
 * environment as vq reads them.
 */
public final class EntryTokenFilter implements Filter {
    public static final String VERDICT_ATTRIBUTE = "vq.entryToken";

    private EntryTokenVerifier verifier;
    private String type;
    private String[] route;
    private Function<HttpServletRequest, String> user;

    /** For web.xml: configured by {@link #init}. */
    public EntryTokenFilter() {}

    public EntryTokenFilter(EntryTokenVerifier verifier, String type, String route) {
        this(verifier, type, route, r -> r.getHeader("X-User-Id"));
    }

    public EntryTokenFilter(EntryTokenVerifier verifier, String type, String route,
                            Function<HttpServletRequest, String> user) {
        configure(verifier, type, route, user);
    }

    private void configure(EntryTokenVerifier verifier, String type, String route,
                           Function<HttpServletRequest, String> user) {
        if (EntryTokenVerifier.targetType(type) == null) {
            throw new IllegalArgumentException("`" + type + "` is not a target type");
        }
        String[] segments = route.replaceFirst("^/", "").split("/", -1);
        if (!route.startsWith("/") || Collections.frequency(java.util.Arrays.asList(segments), "{id}") != 1) {
            throw new IllegalArgumentException("route must start with / and hold one {id} segment: " + route);
        }
        this.verifier = verifier;
        this.type = type;
        this.route = segments;
        this.user = user;
    }

    @Override
    public void init(FilterConfig config) {
        if (verifier == null) {
            configure(EntryTokenVerifier.fromEnv(), config.getInitParameter("type"), config.getInitParameter("route"),
                    r -> r.getHeader("X-User-Id"));
        }
    }

    /** The id segment when {@code path} is the route (leniently, as vq's gate), else null. */
    String match(String path) {
        String p = path.startsWith("/") ? path.substring(1) : path;
        if (p.endsWith("/")) {
            p = p.substring(0, p.length() - 1);
        }
        String[] parts = p.split("/", -1);
        if (parts.length != route.length) {
            return null;
        }
        String id = null;
        for (int i = 0; i < parts.length; i++) {
            String bare = parts[i].split(";", -1)[0].trim();
            if (route[i].equals("{id}")) {
                id = bare;
                continue;
            }
            String lower = bare.toLowerCase(Locale.ROOT);
            String literal = route[i].toLowerCase(Locale.ROOT);
            if (!lower.equals(literal) && !lower.startsWith(literal + ".")) {
                return null;
            }
        }
        return id;
    }

    @Override
    public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
        if (!(request instanceof HttpServletRequest)) {
            chain.doFilter(request, response);
            return;
        }
        HttpServletRequest req = (HttpServletRequest) request;
        HttpServletResponse res = (HttpServletResponse) response;
        String path = req.getServletPath() + (req.getPathInfo() == null ? "" : req.getPathInfo());
        String id = match(path);
        if (id == null) {
            chain.doFilter(request, response);
            return;
        }
        for (String name : new String[] {"X-User-Id", "X-Entry-Token"}) {
            if (Collections.list(req.getHeaders(name)).size() > 1) {
                deny(res, 400, "INVALID_REQUEST", name + " sent more than once: send it once");
                return;
            }
        }
        EntryTokenVerifier.Verdict verdict;
        try {
            verdict = verifier.verify(type, id, user.apply(req), req.getHeader("X-Entry-Token"));
        } catch (IllegalArgumentException e) {
            deny(res, 400, "INVALID_REQUEST", e.getMessage());
            return;
        }
        if (!verdict.isValid()) {
            deny(res, 403, "QUEUE_BYPASS_DENIED", verdict.detail());
            return;
        }
        req.setAttribute(VERDICT_ATTRIBUTE, verdict);
        chain.doFilter(request, response);
    }

    private static void deny(HttpServletResponse res, int status, String code, String detail) throws IOException {
        byte[] body = ("{\"code\":\"" + code + "\",\"detail\":\"" + json(detail) + "\"}").getBytes(StandardCharsets.UTF_8);
        res.setStatus(status);
        res.setContentType("application/json");
        res.setContentLength(body.length);
        res.getOutputStream().write(body);
    }

    private static String json(String s) {
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.toString();
    }
}
