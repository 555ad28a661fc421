"""Host-side tests of the pure rules (stock CPython, no component): `build.sh` runs them before it
builds. Each test names the fact or correction it pins."""

import json
import unittest

from proxmox import api, config, create, errors, ids, mark, state, task
from proxmox.api import Http, Resource, Transport, TransportKind

SIMULATOR = json.dumps({"apiUrl": "https://192.168.0.8:8006", "nodes": ["pv1-1"], "templateVmid": 9001,
                        "targetStorage": "local-lvm"})


def kind_of(call):
    try:
        call()
    except errors.Problem as failure:
        return failure.kind
    return None


class ConfigTests(unittest.TestCase):
    def test_minimal_configuration_takes_the_defaults(self):
        parsed = config.Config.parse(SIMULATOR)
        self.assertEqual(parsed.authority, "192.168.0.8:8006")
        self.assertEqual((parsed.vmid_min, parsed.vmid_max), (100_000, 199_999))
        self.assertEqual((parsed.poll_ms, parsed.clone_seconds, parsed.running_seconds), (2000, 600, 60))

    def test_garbage_and_missing_fields_are_permanent(self):
        base = json.loads(SIMULATOR)
        cases = ["", "[]", "{", "null", json.dumps({k: v for k, v in base.items() if k != "nodes"}),
                 json.dumps({**base, "tokenFile": "/x"}), json.dumps({**base, "apiUrl": "http://pve"}),
                 json.dumps({**base, "apiUrl": "https://root:pw@pve"}), json.dumps({**base, "nodes": []}),
                 json.dumps({**base, "templateVmid": True}), json.dumps({**base, "templateVmid": 150000}),
                 json.dumps({**base, "budgets": {"pollMs": 0}}), json.dumps({**base, "apiUrl": "https://pve/api2"})]
        for text in cases:
            with self.subTest(text=text):
                self.assertEqual(kind_of(lambda: config.Config.parse(text)), errors.PERMANENT)
        try:
            config.Config.parse(json.dumps({**base, "apiUrl": "https://root:pw@pve"}))
        except errors.Problem as failure:
            self.assertNotIn("pw@", failure.message)

    def test_schema_lists_exactly_the_accepted_keys(self):
        schema = json.loads(config.schema_text())
        self.assertFalse(schema["additionalProperties"])
        self.assertEqual(schema["required"], ["apiUrl", "nodes", "templateVmid"])


class MarkTests(unittest.TestCase):
    def test_f10_f11_mark_round_trips_with_uid_time_and_tags(self):
        written = mark.Mark("uid-1", "2026-09-18T15:02:00Z", [("egress.io/pool", "blue"), ("team", "a=b")])
        text = written.format()
        self.assertEqual(text, "egress-operator: managed\nuid: uid-1\ncreated-at: 2026-09-18T15:02:00Z\n"
                               "tag: egress.io/pool=blue\ntag: team=a=b\n")
        self.assertEqual(mark.Mark.parse(text), written)
        self.assertTrue(written.has_tag("team", "a=b"))
        self.assertFalse(written.has_tag("team", "a"))

    def test_descriptions_without_the_header_are_not_marks(self):
        for text in [None, "", "uid: x\n", "notes\negress-operator: managed\nuid: x"]:
            self.assertIsNone(mark.Mark.parse(text), text)
        self.assertEqual(mark.Mark.parse("egress-operator: managed\ncreated-at: t\n").uid, "")

    def test_newlines_cannot_forge_lines(self):
        forged = mark.Mark("a\nuid: b").format()
        self.assertEqual(mark.Mark.parse(forged).uid, "a uid: b")


class ErrorTests(unittest.TestCase):
    def test_f5_whole_message_matchers_tell_the_three_agent_texts_apart(self):
        rows = [("VM 199999 is not running", (True, False, False)),
                ("QEMU guest agent is not running", (False, True, False)),
                ("No QEMU guest agent configured", (False, False, True)),
                ("VM 12a is not running", (False, False, False))]
        for text, expected in rows:
            self.assertEqual((errors.is_vm_not_running(text), errors.is_agent_not_running(text),
                              errors.is_agent_not_configured(text)), expected, text)

    def test_f2_f4_matchers(self):
        self.assertTrue(errors.is_missing_vm("Configuration file 'nodes/pv1-1/qemu-server/999999.conf' does not exist"))
        self.assertFalse(errors.is_missing_vm("Configuration file 'nodes/pv1-1/lxc/999999.conf' does not exist"))
        self.assertTrue(errors.is_vmid_taken("unable to create VM 199999: config file already exists"))
        self.assertFalse(errors.is_vmid_taken("unable to create VM 199999: clone failed"))

    def test_classification_table(self):
        rows = [(Http(500, "Configuration file 'nodes/pv1-1/qemu-server/9.conf' does not exist"), errors.NOT_FOUND),
                (Http(500, "VM is locked (clone)"), errors.TRANSIENT),
                (Http(595, "Connection refused"), errors.TRANSIENT),
                (Http(500, "write failed: No space left on device"), errors.QUOTA_EXCEEDED),
                (Http(400, "Parameter verification failed."), errors.PERMANENT),
                (Http(401, "HTTP status 401"), errors.PERMANENT),
                (Http(403, "Permission check failed"), errors.PERMANENT),
                (Http(501, "Method not implemented"), errors.PERMANENT),
                (Transport(TransportKind.TLS, "x"), errors.PERMANENT),
                (Transport(TransportKind.DENIED, "x"), errors.PERMANENT),
                (Transport(TransportKind.UNREACHABLE, "x"), errors.TRANSIENT),
                (Transport(TransportKind.CREDENTIALS_UNAVAILABLE, "x"), errors.TRANSIENT),
                (api.Decode("x"), errors.TRANSIENT)]
        for error, expected in rows:
            self.assertEqual(errors.classify("op", error).kind, expected, str(error))

    def test_f1_f22_error_message_is_the_trimmed_body_message_else_the_status(self):
        self.assertEqual(api.http_error(api.Response(500, b'{"data":null,"message":"VM is locked (clone)\\n"}')).message,
                         "VM is locked (clone)")
        for body in [b"", b'{"data":null}', b" \n "]:
            self.assertEqual(api.http_error(api.Response(401, body)).message, "HTTP status 401")
        self.assertEqual(api.http_error(api.Response(502, b"<html>\n502 Bad Gateway</html>")).message,
                         "HTTP status 502: <html> 502 Bad Gateway</html>")


class StateTests(unittest.TestCase):
    def entry(self, status, lock=None, name="p"):
        return Resource(vmid=100_123, kind="qemu", node="pv1-1", name=name, status=status, lock=lock)

    def test_correction1_f8_locked_or_unknown_entries_are_in_progress(self):
        self.assertTrue(state.entry_in_progress(self.entry("unknown", "clone", None)))
        self.assertTrue(state.entry_in_progress(self.entry("unknown")))
        self.assertTrue(state.entry_in_progress(self.entry("stopped", "backup")))
        self.assertFalse(state.entry_in_progress(self.entry("stopped", "suspended")))
        self.assertFalse(state.entry_in_progress(self.entry("running")))

    def test_f14_correction6_power_table(self):
        rows = [({"status": "stopped", "qmpstatus": "stopped"}, state.STOPPED),
                ({"status": "running", "qmpstatus": "paused"}, state.STOPPED),
                ({"status": "running", "qmpstatus": "suspended"}, state.STOPPED),
                ({"status": "running", "qmpstatus": "prelaunch"}, state.PROVISIONING),
                ({"status": "running", "qmpstatus": "running"}, state.ASK_AGENT),
                ({"status": "running"}, state.ASK_AGENT)]
        for status, expected in rows:
            self.assertEqual(state.power(status), expected, status)
        self.assertEqual(kind_of(lambda: state.power({"status": "unknown"})), errors.TRANSIENT)

    def test_f21_usable_addresses_skip_loopback_link_local_and_ipv6(self):
        interfaces = [{"name": "lo", "ip-addresses": [{"ip-address": "127.0.0.1", "ip-address-type": "ipv4"}]},
                      {"name": "ens18", "ip-addresses": [
                          {"ip-address": "169.254.3.4", "ip-address-type": "ipv4"},
                          {"ip-address": "192.168.4.147", "ip-address-type": "ipv4"},
                          {"ip-address": "fe80::1", "ip-address-type": "ipv6"}]},
                      {"name": "ens19", "ip-addresses": [{"ip-address": "10.0.0.5", "ip-address-type": "ipv4"},
                                                         {"ip-address": "192.168.4.147", "ip-address-type": "ipv4"}]}]
        self.assertEqual(state.usable_ipv4(interfaces), ["192.168.4.147", "10.0.0.5"])

    def test_f5_correction9_agent_table(self):
        def failing(message):
            def read():
                raise Http(500, message)
            return read
        self.assertEqual(state.agent_state(failing("QEMU guest agent is not running")), (state.PROVISIONING, []))
        self.assertEqual(state.agent_state(failing("No QEMU guest agent configured")), (state.FAILED, []))
        self.assertEqual(kind_of(lambda: state.agent_state(failing("VM 100 is not running"))), errors.TRANSIENT)
        self.assertEqual(kind_of(lambda: state.agent_state(failing("Permission check failed"))), errors.TRANSIENT)
        self.assertEqual(state.agent_state(lambda: []), (state.PROVISIONING, []))


class TaskTests(unittest.TestCase):
    def test_f16_upids_and_outcomes(self):
        self.assertEqual(task.upid_node("UPID:pv1-1:0017C594:0ADB2769:63EC5455:imgcopy::root@pam!egress:"), "pv1-1")
        self.assertEqual(task.upid_node("UPID:pve:00303F51:109D93CFE:61CCA568:qmclone:9001:root@pam:"), "pve")
        for bad in ["", "UPID:pv1-1", "UPID:-x:00000001:00000002:00000003:t:1:u:"]:
            with self.assertRaises(ValueError):
                task.upid_node(bad)
        self.assertEqual(task.task_outcome({"status": "running"})[0], task.RUNNING)
        self.assertEqual(task.task_outcome({"status": "stopped", "exitstatus": "OK"})[0], task.SUCCEEDED)
        self.assertEqual(task.task_outcome({"status": "stopped", "exitstatus": "WARNINGS: 2"})[0], task.SUCCEEDED)
        self.assertEqual(task.task_outcome({"status": "stopped", "exitstatus": "boom"}), (task.FAILED, "boom"))

    def test_f7_locks(self):
        self.assertEqual(task.lock_state(None), task.UNLOCKED)
        self.assertEqual(task.lock_state("suspended"), task.SUSPENDED)
        self.assertEqual(task.lock_state("clone"), task.HELD)


class CreateRuleTests(unittest.TestCase):
    OURS = "egress-operator: managed\nuid: uid-1\ncreated-at: 2026-09-18T15:02:00Z\n"

    def test_correction2_start_vmid_is_deterministic_and_probes_stay_in_range(self):
        first = create.start_vmid("proxy-a", 100_000, 199_999)
        self.assertEqual(first, create.start_vmid("proxy-a", 100_000, 199_999))
        self.assertNotEqual(first, create.start_vmid("proxy-b", 100_000, 199_999))
        self.assertEqual(create.start_vmid("anything", 500, 500), 500)
        small = create.probe_sequence("proxy-a", 100, 103)
        self.assertEqual(sorted(small), [100, 101, 102, 103])
        self.assertEqual(len(create.probe_sequence("proxy-a", 100_000, 199_999)), create.MAX_PROBES)

    def test_correction2_ownership_check_table(self):
        self.assertEqual(create.judge(1, {"name": "proxy-a", "description": self.OURS}, "proxy-a", "uid-1"), create.ADOPT)
        self.assertEqual(create.judge(1, {"name": "other", "description": self.OURS}, "proxy-a", "uid-1"), create.FOREIGN)
        self.assertEqual(kind_of(lambda: create.judge(1, {"name": "proxy-a", "description": self.OURS},
                                                      "proxy-a", "uid-2")), errors.PERMANENT)
        self.assertEqual(kind_of(lambda: create.judge(1, {"name": "proxy-a"}, "proxy-a", "uid-1")), errors.PERMANENT)
        self.assertEqual(kind_of(lambda: create.judge(1, {"name": "proxy-a", "description": self.OURS,
                                                          "lock": "suspended"}, "proxy-a", "uid-1")), errors.PERMANENT)

    def test_f10_f11_clone_carries_name_mark_storage_and_target_only_across_nodes(self):
        parsed = config.Config.parse(SIMULATOR)
        self.assertEqual(create.clone_params(parsed, 100_001, "proxy-a", self.OURS, "pv1-1"),
                         [("newid", 100_001), ("name", "proxy-a"), ("description", self.OURS), ("full", 1),
                          ("storage", "local-lvm")])
        self.assertIn(("target", "pv1-1"), create.clone_params(parsed, 100_001, "proxy-a", self.OURS, "pv1-2"))


class IdTests(unittest.TestCase):
    def test_provider_ids_round_trip_and_bad_ones_are_permanent(self):
        self.assertEqual(str(ids.VmId.parse("pv1-1/100123")), "pv1-1/100123")
        for bad in ["", "pv1-1", "/100", "pv1-1/", "pv1-1/99", "pv1-1/1x", "a/b/1", "pv 1/100", "n/+100", "n/9999999999"]:
            self.assertEqual(kind_of(lambda: ids.VmId.parse(bad)), errors.PERMANENT, bad)


class FormTests(unittest.TestCase):
    def test_form_bodies_are_urlencoded_in_order(self):
        self.assertEqual(api.form([("tags", "proxy_operator"), ("description", "a b\n=c")]),
                         b"tags=proxy_operator&description=a%20b%0A%3Dc")


if __name__ == "__main__":
    unittest.main()
