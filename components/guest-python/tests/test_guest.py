"""Host-side tests of the guest library (stock CPython, with componentize-py's bindings on the path;
`components/python-proxmox/build.sh` runs them). The host's side of `send` is a script here; the
operator's tests (`host/operator/tests/all/example_python.rs`) run it against the real broker."""

import json
import unittest
from unittest import mock

from componentize_py_types import Err
from wit_world.imports import exchange
from wit_world.imports import wasi_http_types as wasi

import egress_guest
from egress_guest import Endpoint, Problem, Request, TransportError, TransportKind, http
from egress_guest.health import reason_of_status, reason_of_transport


class ClassTests(unittest.TestCase):
    def test_statuses_map_to_the_four_classes(self):
        cases = {200: None, 204: None, 404: "not-found", 408: "transient", 429: "transient", 500: "transient",
                 503: "transient", 507: "quota-exceeded", 400: "permanent", 401: "permanent", 403: "permanent",
                 409: "permanent", 302: "permanent", 600: "permanent"}
        for status, kind in cases.items():
            self.assertEqual(egress_guest.class_of_status(status), kind, status)

    def test_transport_failures_map_to_kinds_classes_and_reasons(self):
        cases = [(wasi.ErrorCode_ConnectionRefused(), None, TransportKind.UNREACHABLE, "transient", "unreachable"),
                 (wasi.ErrorCode_TlsCertificateError(), None, TransportKind.TLS, "permanent", "certificate-invalid"),
                 (wasi.ErrorCode_HttpRequestDenied(), None, TransportKind.DENIED, "permanent", "misconfigured"),
                 (wasi.ErrorCode_InternalError("credentials-unavailable"), None,
                  TransportKind.CREDENTIALS_UNAVAILABLE, "transient", "credentials-unavailable"),
                 (wasi.ErrorCode_InternalError("boom"), None, TransportKind.OTHER, "transient", "other"),
                 # The exchange call's refusal says more than its code.
                 (wasi.ErrorCode_InternalError(None), exchange.Refusal.CREDENTIALS_UNAVAILABLE,
                  TransportKind.CREDENTIALS_UNAVAILABLE, "transient", "credentials-unavailable"),
                 (wasi.ErrorCode_HttpRequestDenied(), exchange.Refusal.NOT_GRANTED, TransportKind.DENIED,
                  "permanent", "misconfigured")]
        for code, refusal, kind, error_class, reason in cases:
            error = http.transport_error(code, refusal)
            self.assertEqual((error.kind, error.problem().kind, reason_of_transport(error)),
                             (kind, error_class, reason), error.detail)

    def test_health_statuses(self):
        self.assertEqual([reason_of_status(s) for s in (200, 401, 403, 404, 500)],
                         ["ok", "unauthorized", "forbidden", "misconfigured", "other"])


class SendTests(unittest.TestCase):
    """`send` over a scripted host: what reaches `wasi:http` and the exchange call."""

    def test_wasi_http_sends_an_exact_content_length(self):
        seen = []

        def from_list(entries):
            seen.append(dict(entries))
            raise Err(wasi.HeaderError_Forbidden())  # stop before any host call

        endpoint = Endpoint.parse("http://127.0.0.1:9/api")
        with mock.patch.object(http, "exchange", None), mock.patch.object(wasi.Fields, "from_list", from_list):
            for request in [Request.new("POST", endpoint, "/vms", json={"name": "a"}),
                            Request.new("DELETE", endpoint, "/vms/1"), Request.new("GET", endpoint, "/vms")]:
                with self.assertRaises(TransportError):
                    egress_guest.send(request)
        self.assertEqual([headers.get("content-length") for headers in seen], [b"13", b"0", None])
        self.assertEqual(seen[0]["content-type"], b"application/json")

    def test_the_exchange_call_gets_the_whole_request_and_its_refusal_is_read(self):
        sent = []

        def answer(request, max_bytes):
            sent.append(request)
            if request.path_with_query.endswith("/denied"):
                raise Err(exchange.ExchangeError_Failed(exchange.Failure(wasi.ErrorCode_HttpRequestDenied(),
                                                                         exchange.Refusal.DENIED)))
            return exchange.Response(404, [], b'{"error": "no such VM"}')

        endpoint = Endpoint.parse("https://inventory.example:8443/v1")
        with mock.patch.object(exchange, "send", answer):
            with self.assertRaises(Problem) as gone:
                egress_guest.get_json(endpoint, "/vms/1")
            with self.assertRaises(Problem) as denied:
                egress_guest.call(Request.new("POST", endpoint, "/denied", body=b"x", content_type="text/plain"))
        self.assertEqual((gone.exception.kind, denied.exception.kind), ("not-found", "permanent"))
        self.assertIn("no such VM", gone.exception.message)
        self.assertIn("refused: denied", denied.exception.message)
        self.assertEqual((sent[0].authority, sent[0].path_with_query, sent[0].body), ("inventory.example:8443", "/v1/vms/1", b""))
        self.assertEqual(sent[1].body, b"x")
        # The host sets content-length from the body: a guest's own would be refused.
        self.assertNotIn("content-length", [name for name, _ in sent[1].headers])

    def test_post_json_sends_its_value_or_no_body_and_decodes_the_answer(self):
        sent = []

        def answer(request, max_bytes):
            sent.append(request)
            return exchange.Response(200, [], b'{"id": "3", "state": "provisioning"}')

        endpoint = Endpoint.parse("http://127.0.0.1:9")
        with mock.patch.object(exchange, "send", answer):
            created = egress_guest.post_json(endpoint, "/vms", {"name": "a"})
            started = egress_guest.post_json(endpoint, "/vms/3/start")
        self.assertEqual((created["id"], started["state"]), ("3", "provisioning"))
        self.assertEqual([(r.path_with_query, r.body) for r in sent], [("/vms", b'{"name": "a"}'), ("/vms/3/start", b"")])
        self.assertTrue(all(isinstance(r.method, wasi.Method_Post) for r in sent))


class ValueTests(unittest.TestCase):
    def test_endpoints_parse_without_echoing_user_info(self):
        self.assertEqual(Endpoint.parse("HTTPS://a:8443/base/"), Endpoint("https", "a:8443", "/base"))
        for url in ["ftp://a", "http://", "http://a b", "http://a?x", 7]:
            with self.assertRaises(Problem, msg=url):
                Endpoint.parse(url)
        with self.assertRaises(Problem) as secret:
            Endpoint.parse("http://root:hunter2@a")
        self.assertNotIn("hunter2", secret.exception.message)

    def test_configurations_refuse_unknown_and_missing_keys_by_name_only(self):
        self.assertEqual(egress_guest.config('{"url": "x"}', required=["url"]), {"url": "x"})
        for text in ["", "[]", "{}", '{"url": "x", "token": "s3cret"}']:
            with self.assertRaises(Problem, msg=text) as refused:
                egress_guest.config(text, required=["url"])
            self.assertEqual(refused.exception.kind, "permanent")
            self.assertNotIn("s3cret", refused.exception.message)

    def test_a_body_that_is_not_json_is_transient(self):
        with self.assertRaises(Problem) as page:
            egress_guest.Response(200, b"<html>maintenance</html>").decode()
        self.assertEqual(page.exception.kind, "transient")
        self.assertEqual(egress_guest.Response(200, json.dumps([1]).encode()).decode(), [1])

    def test_percent_encoding_keeps_only_unreserved_characters(self):
        self.assertEqual(egress_guest.percent_encode("Proxy-1.a_b~"), "Proxy-1.a_b~")
        self.assertEqual(egress_guest.percent_encode("a=b&c/d?e f%é"), "a%3Db%26c%2Fd%3Fe%20f%25%C3%A9")

    def test_created_at_is_rfc3339_utc(self):
        self.assertEqual(egress_guest.time.rfc3339(0), "1970-01-01T00:00:00Z")
        self.assertEqual(egress_guest.time.rfc3339(951_782_400), "2000-02-29T00:00:00Z")
        self.assertEqual(egress_guest.time.rfc3339(1_790_145_676), "2026-09-23T06:41:16Z")


if __name__ == "__main__":
    unittest.main()
