//go:build ovlkit_guest

package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/gzip"

	"github.com/ovlkit/ovlkit/graph"
	"github.com/ovlkit/ovlkit/tests/guest/guesttest"
)

// runReal runs one ovlgraph command as the binary does: the real store,
// probing the booted kernel. Each call opens the store afresh, as each
// command line is a process of its own.
func runReal(t *testing.T, stdin io.Reader, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	if stdin == nil {
		stdin = strings.NewReader("")
	}
	code := run(context.Background(), args, &env{stdin: stdin, stdout: &out, stderr: &errb, open: graph.Open})
	return code, out.String(), errb.String()
}

// TestREADMESession runs the README's session on every upper filesystem
// against the booted kernel: a gzip'd image layer in, a container layer on
// it mounted by one command and unmounted by another, a write and a
// deletion through the mount, its changes and its diff out, and the store
// checked and taken down again.
func TestREADMESession(t *testing.T) {
	guesttest.ForEachFS(t, func(t *testing.T, fs guesttest.FS) {
		home := filepath.Join(fs.Scratch(t, ""), "layers")
		cli := func(stdin io.Reader, args ...string) string {
			t.Helper()
			code, out, errs := runReal(t, stdin, append([]string{"--home", home}, args...)...)
			if code != 0 {
				t.Fatalf("ovlgraph %s: exit %d: %s", strings.Join(args, " "), code, errs)
			}
			return out
		}
		cli(nil, "init")
		cli(nil, "create", "base")
		if out := cli(gzipTar(t, "etc/motd", "hello\n", "etc/hosts", "127.0.0.1 localhost\n"), "apply", "base"); out != "applied base: 26 bytes\n" {
			t.Errorf("apply: %q", out)
		}
		cli(nil, "create", "--rw", "--parent", "base", "ctr")
		mnt := strings.TrimSpace(cli(nil, "mount", "ctr"))
		t.Cleanup(func() { runReal(t, nil, "--home", home, "umount", "ctr") })
		if b, err := os.ReadFile(filepath.Join(mnt, "etc/motd")); err != nil || string(b) != "hello\n" {
			t.Fatalf("read through %s: %q %v", mnt, b, err)
		}
		if err := os.WriteFile(filepath.Join(mnt, "etc/new"), []byte("new\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(mnt, "etc/hosts")); err != nil {
			t.Fatal(err)
		}
		if out := cli(nil, "changes", "ctr"); out != "C /etc\nD /etc/hosts\nA /etc/new\n" {
			t.Errorf("changes: %q", out)
		}
		names := tarNames(t, cli(nil, "diff", "ctr"))
		if strings.Join(names, " ") != "etc/ etc/.wh.hosts etc/new" {
			t.Errorf("diff members: %v", names)
		}
		var ls []graph.LayerInfo
		if err := json.Unmarshal([]byte(cli(nil, "--json", "ls")), &ls); err != nil || len(ls) != 2 || ls[1].Mounts != 1 {
			t.Errorf("ls --json while mounted: %+v %v", ls, err)
		}
		if out := cli(nil, "status"); !strings.Contains(out, "ctr") {
			t.Errorf("status does not list the mounted layer:\n%s", out)
		}
		if out := cli(nil, "umount", "ctr"); out != "ctr: 0 reference(s) left\n" {
			t.Errorf("umount: %q", out)
		}
		if _, err := os.Stat(filepath.Join(mnt, "etc/motd")); err == nil {
			t.Error("the layer is still mounted after umount")
		}
		if out := cli(nil, "check"); out != "ok\n" {
			t.Errorf("check: %q", out)
		}
		cli(nil, "rm", "ctr")
		cli(nil, "rm", "base")
		if out := cli(nil, "--json", "ls"); strings.TrimSpace(out) != "[]" {
			t.Errorf("ls after rm: %q", out)
		}
	})
}

func gzipTar(t *testing.T, nameBody ...string) io.Reader {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for i := 0; i+1 < len(nameBody); i += 2 {
		body := nameBody[i+1]
		if err := tw.WriteHeader(&tar.Header{Name: nameBody[i], Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func tarNames(t *testing.T, s string) []string {
	t.Helper()
	tr := tar.NewReader(strings.NewReader(s))
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("diff is not a tar: %v", err)
		}
		out = append(out, h.Name)
	}
}
