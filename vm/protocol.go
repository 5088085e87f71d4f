package vm

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// The guest side (initramfs/ovlinit) frames test output with records that
// start with this tag; keep the two in sync.
const tag = "\x1eovlkit "

// A guestRun is what the guest sent over the results console.
type guestRun struct {
	Kernel   string // uname of the guest kernel
	Binaries []binaryOutput
	Kmsg     []string
	Done     bool     // the guest reached the end of its run
	Notes    []string // guest-side errors (exec failures, kmsg problems)
}

type binaryOutput struct {
	Pkg      string
	Output   []byte // raw -test.v=test2json output
	ExitCode int
	Seconds  float64
	Ended    bool
}

// parseGuestStream reads the results console stream. It never fails on
// truncated input: a guest that died mid-run leaves Done false and the last
// binary not Ended, which the caller reports.
func parseGuestStream(r io.Reader) (*guestRun, error) {
	run := &guestRun{}
	var cur *binaryOutput
	inKmsg := false
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadString('\n')
		// A console that still translates newlines sends CR LF.
		if strings.HasSuffix(line, "\r\n") {
			line = line[:len(line)-2] + "\n"
		}
		if line != "" {
			handleLine(run, &cur, &inKmsg, line)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return run, fmt.Errorf("read results: %w", err)
		}
	}
	if cur != nil {
		run.Binaries = append(run.Binaries, *cur)
	}
	return run, nil
}

func handleLine(run *guestRun, cur **binaryOutput, inKmsg *bool, line string) {
	i := strings.Index(line, tag)
	if i < 0 {
		switch {
		case *inKmsg:
			run.Kmsg = append(run.Kmsg, strings.TrimRight(line, "\n"))
		case *cur != nil:
			(*cur).Output = append((*cur).Output, line...)
		}
		return
	}
	// Output a test printed without a final newline precedes the tag.
	if i > 0 && *cur != nil {
		(*cur).Output = append((*cur).Output, line[:i]...)
	}
	rec := strings.Fields(strings.TrimSpace(line[i+len(tag):]))
	if len(rec) == 0 {
		return
	}
	switch rec[0] {
	case "start":
		run.Kernel = strings.Join(rec[1:], " ")
	case "begin":
		if *cur != nil {
			run.Binaries = append(run.Binaries, **cur)
		}
		pkg := ""
		if len(rec) > 1 {
			pkg = rec[1]
		}
		*cur = &binaryOutput{Pkg: pkg}
	case "end":
		if *cur != nil && len(rec) >= 4 {
			(*cur).ExitCode, _ = strconv.Atoi(rec[2])
			(*cur).Seconds, _ = strconv.ParseFloat(rec[3], 64)
			(*cur).Ended = true
			run.Binaries = append(run.Binaries, **cur)
			*cur = nil
		}
	case "kmsg":
		*inKmsg = true
	case "kmsg-end":
		*inKmsg = false
	case "note", "error":
		run.Notes = append(run.Notes, strings.Join(rec[1:], " "))
	case "done":
		run.Done = true
	}
}
