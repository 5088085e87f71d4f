package vm

import (
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/vm/guestproto"
)

// acked builds a model from acks, failing on a protocol error.
func acked(t *testing.T, acks ...guestproto.CutAck) *cutModel {
	t.Helper()
	m := newCutModel()
	for _, a := range acks {
		if err := m.ack(a); err != nil {
			t.Fatal(err)
		}
	}
	return m
}

var (
	baseFiles = map[string]string{"/d/big": "aa", "/link": "-> d/big"}
	baseAcks  = []guestproto.CutAck{
		{Op: "init"},
		{Op: "create", ID: "base"},
		{Op: "apply", ID: "base", Files: baseFiles},
		{Op: "create", ID: "ctr", Parent: "base", RW: true},
		{Op: "write", ID: "ctr", Files: map[string]string{"/w-0-1": "bb"}},
	}
)

func soundReport() guestproto.CutReport {
	return guestproto.CutReport{FS: "ext4", Store: true, Layers: []guestproto.CutLayer{
		{ID: "base", State: "ok", Files: map[string]string{"/d/big": "aa", "/link": "-> d/big"}},
		{ID: "ctr", Parent: "base", RW: true, State: "empty", Files: map[string]string{"/w-0-1": "bb"}},
	}}
}

func wantViolation(t *testing.T, v []string, substr string) {
	t.Helper()
	for _, s := range v {
		if strings.Contains(s, substr) {
			return
		}
	}
	t.Errorf("no violation mentions %q; got %q", substr, v)
}

func TestCutJudgeSound(t *testing.T) {
	m := acked(t, baseAcks...)
	if v := m.judge(soundReport()); len(v) > 0 {
		t.Errorf("a report that holds everything acknowledged: %q", v)
	}
	// The operation under way at the cut may have left one layer.
	r := soundReport()
	r.Layers = append(r.Layers, guestproto.CutLayer{ID: "i1-7", Parent: "base", State: "empty"})
	if v := m.judge(r); len(v) > 0 {
		t.Errorf("one unacknowledged layer: %q", v)
	}
	r.Layers = append(r.Layers, guestproto.CutLayer{ID: "i1-8", State: "empty"})
	wantViolation(t, m.judge(r), "2 layers whose create was never acknowledged")
}

func TestCutJudgeLosses(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(r *guestproto.CutReport)
		wants string
	}{
		{"layer gone", func(r *guestproto.CutReport) { r.Layers = r.Layers[1:] }, "base: its create was acknowledged, but it is gone"},
		{"apply lost", func(r *guestproto.CutReport) { r.Layers[0].State, r.Layers[0].Files = "empty", nil }, "its apply was acknowledged, but verify says empty"},
		{"content", func(r *guestproto.CutReport) {
			r.Layers[0].Files = map[string]string{"/d/big": "00", "/link": "-> d/big"}
		}, "changed /d/big"},
		{"damaged", func(r *guestproto.CutReport) {
			r.Layers[0].State, r.Layers[0].Damage = "damaged", []string{"/d/big: size 0"}
		}, "not complete: verify says damaged: /d/big: size 0"},
		{"write lost", func(r *guestproto.CutReport) { r.Layers[1].Files = nil }, "acknowledged write of /w-0-1 is lost"},
		{"write torn", func(r *guestproto.CutReport) { r.Layers[1].Files = map[string]string{"/w-0-1": "cc"} }, "reads back as cc"},
		{"parent", func(r *guestproto.CutReport) { r.Layers[1].Parent = "" }, `parent "" rw=true`},
		{"check", func(r *guestproto.CutReport) { r.Problems = []string{"l/X belongs to no layer"} }, "check: l/X belongs to no layer"},
		{"staging", func(r *guestproto.CutReport) { r.Staging = []string{"apply-x"} }, "left in staging/ after recovery: apply-x"},
		{"mounts", func(r *guestproto.CutReport) { r.Mounts = []string{"/mnt/cuts/ext4/store/layers/base/merged"} }, "mounted after Cleanup"},
		{"bad content", func(r *guestproto.CutReport) { r.Layers[0].Bad = []string{"content is not the workload's"} }, "base: content is not the workload's"},
		{"store gone", func(r *guestproto.CutReport) { *r = guestproto.CutReport{FS: "ext4"} }, "no store is there"},
		{"open fails", func(r *guestproto.CutReport) { *r = guestproto.CutReport{FS: "ext4", OpenError: "state.log: torn"} }, "open: state.log: torn"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := soundReport()
			c.edit(&r)
			wantViolation(t, acked(t, baseAcks...).judge(r), c.wants)
		})
	}
}

func TestCutJudgeRemoved(t *testing.T) {
	m := acked(t, append(baseAcks, guestproto.CutAck{Op: "remove", ID: "ctr"})...)
	r := soundReport()
	wantViolation(t, m.judge(r), "ctr: its remove was acknowledged, but it is back")
	r.Layers = r.Layers[:1]
	if v := m.judge(r); len(v) > 0 {
		t.Errorf("removed layer absent: %q", v)
	}
}

// TestCutJudgeRemoveUnderWay: a layer whose remove was announced but not
// acknowledged may be gone; any other acknowledged layer may not.
func TestCutJudgeRemoveUnderWay(t *testing.T) {
	m := acked(t, baseAcks...)
	m.underWay = &guestproto.CutAck{Op: "remove", ID: "ctr"}
	r := soundReport()
	r.Layers = r.Layers[:1]
	if v := m.judge(r); len(v) > 0 {
		t.Errorf("layer whose remove was under way is gone: %q", v)
	}
	m.underWay = &guestproto.CutAck{Op: "remove", ID: "other"}
	wantViolation(t, m.judge(r), "ctr: its create was acknowledged, but it is gone")
	m.adopt(soundReport())
	if m.underWay != nil {
		t.Error("adopt kept the operation under way of the last cut")
	}
}

func TestCutJudgeNoStoreYet(t *testing.T) {
	// A store whose creation was never acknowledged may be absent.
	if v := newCutModel().judge(guestproto.CutReport{FS: "xfs"}); len(v) > 0 {
		t.Errorf("absent store, nothing acknowledged: %q", v)
	}
}

// TestCutAdopt: what the operation under way left is known after the
// check, and must then survive the next cut like anything acknowledged.
func TestCutAdopt(t *testing.T) {
	m := acked(t, baseAcks...)
	r := soundReport()
	r.Layers = append(r.Layers, guestproto.CutLayer{ID: "i1-7", Parent: "base", State: "ok", Files: map[string]string{"/d/big": "dd"}})
	r.Layers[1].Files["/w-1-3"] = "ee" // a write under way, kept
	if v := m.judge(r); len(v) > 0 {
		t.Fatalf("judge: %q", v)
	}
	m.adopt(r)
	next := soundReport()
	v := m.judge(next)
	wantViolation(t, v, "i1-7: its create was acknowledged, but it is gone")
	wantViolation(t, v, "acknowledged write of /w-1-3 is lost")
	next.Layers = r.Layers
	if v := m.judge(next); len(v) > 0 {
		t.Errorf("the adopted state itself: %q", v)
	}
}

func TestCutAckProtocol(t *testing.T) {
	m := newCutModel()
	if err := m.ack(guestproto.CutAck{Op: "apply", ID: "x"}); err == nil {
		t.Error("apply of an unknown layer accepted")
	}
	if err := m.ack(guestproto.CutAck{Op: "mkfs"}); err == nil {
		t.Error("unknown operation accepted")
	}
	m = acked(t, guestproto.CutAck{Op: "create", ID: "x"})
	if err := m.ack(guestproto.CutAck{Op: "create", ID: "x"}); err == nil {
		t.Error("second create of x accepted")
	}
}

func TestParseCutLine(t *testing.T) {
	for _, c := range []struct{ line, verb, fs, payload string }{
		{"hello", "hello", "", ""},
		{"clean\n", "clean", "", ""},
		{`ack ext4 {"op":"init"}`, "ack", "ext4", `{"op":"init"}`},
		{"begin xfs", "begin", "xfs", ""},
		{"fail xfs apply i1-2: no space left", "fail", "xfs", "apply i1-2: no space left"},
	} {
		verb, fs, payload := parseCutLine(c.line)
		if verb != c.verb || fs != c.fs || payload != c.payload {
			t.Errorf("parseCutLine(%q) = %q %q %q, want %q %q %q", c.line, verb, fs, payload, c.verb, c.fs, c.payload)
		}
	}
	a, err := decodeAck(`{"op":"apply","id":"i0-1","files":{"/d/big":"aa"}}`)
	if err != nil || a.Op != "apply" || a.ID != "i0-1" || a.Files["/d/big"] != "aa" {
		t.Errorf("decodeAck: %+v, %v", a, err)
	}
	if _, err := decodeAck("{"); err == nil {
		t.Error("decodeAck accepted a torn record")
	}
}
