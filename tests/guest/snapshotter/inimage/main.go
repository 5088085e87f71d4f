// Command inimage is the program TestContainerdRun puts into its image's
// top layer and runs with ctr run: a static binary (CGO_ENABLED=0) that
// needs nothing else from the image. It prints what it sees of its
// container, one fact a line, for the test to check:
//
//	pid N           its process ID (1 in a new PID namespace)
//	root FSTYPE     the filesystem type of its root, from its mountinfo
//	read PATH DATA  the content of each -read file, quoted
//	absent PATH     each -absent path, which must not exist
//	wrote PATH      each -write PATH=DATA, written and read back
//
// It exits 1 at the first fact that does not hold.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"strings"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var reads, absents, writes list
	flag.Var(&reads, "read", "print the content of this file (repeatable)")
	flag.Var(&absents, "absent", "check that this path does not exist (repeatable)")
	flag.Var(&writes, "write", "PATH=DATA: write DATA to PATH and read it back (repeatable)")
	flag.Parse()
	if err := run(reads, absents, writes); err != nil {
		fmt.Fprintln(os.Stderr, "inimage:", err)
		os.Exit(1)
	}
}

func run(reads, absents, writes []string) error {
	fmt.Println("pid", os.Getpid())
	root, err := rootType()
	if err != nil {
		return err
	}
	fmt.Println("root", root)
	for _, p := range reads {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fmt.Printf("read %s %q\n", p, b)
	}
	for _, p := range absents {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s: want it absent, lstat says %v", p, err)
		}
		fmt.Println("absent", p)
	}
	for _, w := range writes {
		p, data, ok := strings.Cut(w, "=")
		if !ok {
			return fmt.Errorf("-write %q: want PATH=DATA", w)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if string(b) != data {
			return fmt.Errorf("%s: read back %q, wrote %q", p, b, data)
		}
		fmt.Println("wrote", p)
	}
	return nil
}

// rootType is the filesystem type of the mount at / in
// /proc/self/mountinfo (the last one there, the one on top).
func rootType() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	typ := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 || fields[4] != "/" {
			continue
		}
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) {
				typ = fields[i+1]
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("/proc/self/mountinfo: %w", err)
	}
	if typ == "" {
		return "", errors.New("no mount at / in /proc/self/mountinfo")
	}
	return typ, nil
}
