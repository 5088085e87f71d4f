package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/ovl"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want command
		err  bool
	}{
		{args: []string{"--home", "/h", "init"}, want: command{home: "/h", name: "init", layout: graph.LayoutOverlay}},
		{args: []string{"--home", "/h", "init", "--layout", "hardlink"}, want: command{home: "/h", name: "init", layout: graph.LayoutHardlink}},
		{args: []string{"--home", "/h", "init", "--userxattr"}, want: command{home: "/h", name: "init", layout: graph.LayoutOverlay, userx: true}},
		{args: []string{"--home=/h", "--json", "create", "--rw", "--parent", "p", "c"}, want: command{home: "/h", json: true, name: "create", rw: true, parent: "p", id: "c"}},
		{args: []string{"--home", "/h", "ls", "--json"}, want: command{home: "/h", json: true, name: "ls"}},
		{args: []string{"--home", "/h", "rm", "x"}, want: command{home: "/h", name: "rm", id: "x"}},
		{args: []string{"--home", "/h", "mount", "--volatile", "c"}, want: command{home: "/h", name: "mount", id: "c", volatile: true}},
		{args: []string{"--home", "/h", "umount", "--volatile", "c"}, err: true}, // only mount takes it
		{args: []string{"init"}, err: true},                                    // no --home
		{args: []string{"--home", "/h"}, err: true},                            // no command
		{args: []string{"--home", "/h", "frob"}, err: true},                    // unknown command
		{args: []string{"--home", "/h", "rm"}, err: true},                      // missing ID
		{args: []string{"--home", "/h", "ls", "extra"}, err: true},             // extra argument
		{args: []string{"--home", "/h", "init", "--layout", "zfs"}, err: true}, // bad layout
		{args: []string{"--home", "/h", "create", "--bogus", "x"}, err: true},
		{args: []string{"--home", "/h", "check", "--verify", "--repair"}, want: command{home: "/h", name: "check", verify: true, repair: true}},
		{args: []string{"--home", "/h", "check", "--verify", "base"}, want: command{home: "/h", name: "check", verify: true, id: "base"}},
		{args: []string{"--home", "/h", "check", "--repair"}, err: true}, // repair needs verify
		{args: []string{"--home", "/h", "check", "base"}, err: true},     // an ID needs verify
	} {
		got, err := parse(tc.args)
		if tc.err {
			if !errors.Is(err, errUsage) {
				t.Errorf("%v: err %v, want a usage error", tc.args, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tc.args, err)
			continue
		}
		if got != tc.want {
			t.Errorf("%v: got %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

// testEnv runs the CLI on stores whose features are given, because the
// probe mounts overlays and host tests mount nothing.
func testEnv(stdin string) (*env, *bytes.Buffer, *bytes.Buffer) {
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errb,
		open: func(home string, opts graph.Options) (*graph.Store, error) {
			opts.Features = &ovl.Features{DType: true, Whiteouts: true, Xattrs: true, Overlay: true, MultiLower: true, Notes: map[string]string{"strict_upper": "EINVAL"}}
			opts.Sync = graph.SyncNone
			return graph.Open(home, opts)
		}}
	return e, &out, &errb
}

func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	e, out, errb := testEnv(stdin)
	code := run(context.Background(), args, e)
	return code, out.String(), errb.String()
}

func tarWith(t *testing.T, name, body string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(body))
	tw.Close()
	return buf.String()
}

func TestCLIWorkflow(t *testing.T) {
	home := filepath.Join(t.TempDir(), "store")
	if code, _, errs := runCLI(t, "", "--home", home, "ls"); code == 0 || !strings.Contains(errs, "run init") {
		t.Fatalf("ls before init: code %d, stderr %q", code, errs)
	}
	code, out, errs := runCLI(t, "", "--home", home, "init", "--layout", "hardlink")
	if code != 0 || !strings.Contains(out, "layout hardlink") {
		t.Fatalf("init: %d %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "", "--home", home, "create", "base"); code != 0 {
		t.Fatalf("create base: %s", errs)
	}
	code, out, errs = runCLI(t, tarWith(t, "etc/motd", "hello\n"), "--home", home, "--json", "apply", "base")
	if code != 0 {
		t.Fatalf("apply: %s", errs)
	}
	var applied struct {
		ID   string `json:"id"`
		Size int64  `json:"size"`
	}
	if err := json.Unmarshal([]byte(out), &applied); err != nil || applied.Size != 6 || applied.ID != "base" {
		t.Fatalf("apply json %q: %+v %v", out, applied, err)
	}
	if code, _, errs := runCLI(t, "", "--home", home, "create", "--parent", "base", "child"); code != 0 {
		t.Fatalf("create child: %s", errs)
	}
	code, out, _ = runCLI(t, "", "--home", home, "ls")
	if code != 0 || !strings.Contains(out, "child") || !strings.Contains(out, "base") || !strings.HasPrefix(out, "ID") {
		t.Fatalf("ls: %d %q", code, out)
	}
	code, out, _ = runCLI(t, "", "--home", home, "--json", "ls")
	var ls []graph.LayerInfo
	if err := json.Unmarshal([]byte(out), &ls); code != 0 || err != nil || len(ls) != 2 || ls[1].Parent != "base" {
		t.Fatalf("ls json %q: %v", out, err)
	}
	code, out, _ = runCLI(t, "", "--home", home, "changes", "base")
	if code != 0 || out != "A /etc\nA /etc/motd\n" {
		t.Fatalf("changes: %d %q", code, out)
	}
	code, out, _ = runCLI(t, "", "--home", home, "diff", "base")
	if code != 0 || !strings.Contains(out, "hello") {
		t.Fatalf("diff: %d %q", code, out)
	}
	code, _, errs = runCLI(t, "", "--home", home, "rm", "base")
	if code == 0 || !strings.Contains(errs, "children") {
		t.Fatalf("rm base with child: %d %q", code, errs)
	}
	code, out, _ = runCLI(t, "", "--home", home, "check")
	if code != 0 || out != "ok\n" {
		t.Fatalf("check: %d %q", code, out)
	}
	code, out, _ = runCLI(t, "", "--home", home, "status")
	if code != 0 || !strings.Contains(out, "layout:        hardlink") || !strings.Contains(out, "strict_upper (EINVAL)") {
		t.Fatalf("status: %d %q", code, out)
	}
	for _, id := range []string{"child", "base"} {
		if code, _, errs := runCLI(t, "", "--home", home, "rm", id); code != 0 {
			t.Fatalf("rm %s: %s", id, errs)
		}
	}
	if code, _, errs := runCLI(t, "", "--home", home, "umount", "base"); code == 0 || !strings.Contains(errs, "does not exist") {
		t.Fatalf("umount of a removed layer: %d %q", code, errs)
	}
	code, out, _ = runCLI(t, "", "--home", home, "--json", "check")
	var chk struct {
		OK       bool            `json:"ok"`
		Problems []graph.Problem `json:"problems"`
	}
	if err := json.Unmarshal([]byte(out), &chk); code != 0 || err != nil || !chk.OK || chk.Problems == nil {
		t.Fatalf("check json %q: %+v %v", out, chk, err)
	}
}

func TestCLIUsageExit(t *testing.T) {
	code, out, errs := runCLI(t, "", "--home")
	if code != 2 || out != "" || !strings.Contains(errs, "usage:") {
		t.Fatalf("bad flags: code %d out %q err %q", code, out, errs)
	}
}
