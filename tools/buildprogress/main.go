// Command buildprogress shows how far a kernel build has come. It reads
// kbuild's output on stdin, copies every line to a log file, and counts the
// objects compiled (kbuild's "CC" and "AS" lines) against the number a full
// build of the same configuration made last time.
//
// A cold kernel build under make's quiet output prints nothing useful for
// 5 to 30 minutes; a person at a terminal, or reading a CI log, wants to
// know whether it is moving and when it will end. On a terminal the status
// line is redrawn in place once a second; otherwise one line is printed per
// -every, which keeps CI logs short.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"golang.org/x/sys/unix"
)

// objectLine matches kbuild's quiet line for one compiled object, e.g.
// "  CC      fs/overlayfs/super.o" or "  CC [M]  fs/overlayfs/super.o".
var objectLine = regexp.MustCompile(`^\s+(CC|AS)(\s+\[M\])?\s+\S+\.o$`)

// progress is what the status line is made of.
type progress struct {
	name    string
	expect  int // objects in a full build; 0 when unknown
	done    int
	elapsed time.Duration
}

// String renders p: objects done out of the expected total, the elapsed
// time and, once the rate is known, an estimate of the time left.
func (p progress) String() string {
	el := p.elapsed.Truncate(time.Second)
	if p.expect <= 0 {
		return fmt.Sprintf("%s: %d objects, %s elapsed", p.name, p.done, el)
	}
	pct := 100 * p.done / p.expect
	if pct > 99 {
		pct = 99 // linking follows the last object
	}
	s := fmt.Sprintf("%s: %d/%d objects (%d%%), %s elapsed", p.name, p.done, p.expect, pct, el)
	// Below a few dozen objects the rate says little (the first ones are
	// host tools and generated headers).
	if p.done >= 30 && p.done < p.expect {
		left := time.Duration(float64(p.elapsed) / float64(p.done) * float64(p.expect-p.done))
		s += fmt.Sprintf(", about %s left", left.Round(time.Minute/6))
	}
	return s
}

// reporter prints progress lines: redrawn in place on a terminal, or one
// line per interval elsewhere.
type reporter struct {
	w        io.Writer
	tty      bool
	interval time.Duration
	last     time.Time
}

func (r *reporter) update(p progress, now time.Time, final bool) {
	if r.tty {
		if final || now.Sub(r.last) >= time.Second {
			fmt.Fprintf(r.w, "\r\033[K%s", p)
			r.last = now
		}
		if final {
			fmt.Fprintln(r.w)
		}
		return
	}
	if final || now.Sub(r.last) >= r.interval {
		fmt.Fprintln(r.w, p)
		r.last = now
	}
}

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// copyCounting copies in to log line by line, counting object lines and
// reporting after each one, and at every tick so that the elapsed time
// moves during long links.
func copyCounting(in io.Reader, log io.Writer, p progress, r *reporter, start time.Time) error {
	lines := make(chan string)
	errc := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			lines <- sc.Text()
		}
		errc <- sc.Err()
		close(lines)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				p.elapsed = time.Since(start)
				r.update(p, time.Now(), true)
				if err := <-errc; err != nil {
					return fmt.Errorf("read build output: %w", err)
				}
				return nil
			}
			if _, err := fmt.Fprintln(log, line); err != nil {
				return fmt.Errorf("write build log: %w", err)
			}
			if objectLine.MatchString(line) {
				p.done++
			}
		case <-tick.C:
		}
		p.elapsed = time.Since(start)
		r.update(p, time.Now(), false)
	}
}

func main() {
	logPath := flag.String("log", "", "copy the build output to this file (required)")
	name := flag.String("name", "build", "what is being built, for the status line")
	expect := flag.Int("expect", 0, "objects a full build makes (0: unknown)")
	every := flag.Duration("every", 30*time.Second, "interval between lines when not on a terminal")
	flag.Parse()
	if *logPath == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: buildprogress -log FILE [-name NAME] [-expect N] [-every D] < build-output")
		os.Exit(2)
	}
	log, err := os.Create(*logPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildprogress: %v\n", err)
		os.Exit(1)
	}
	r := &reporter{w: os.Stderr, tty: isTerminal(os.Stderr), interval: *every, last: time.Now()}
	err = copyCounting(os.Stdin, log, progress{name: *name, expect: *expect}, r, time.Now())
	if cerr := log.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close build log: %w", cerr)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildprogress: %v\n", err)
		os.Exit(1)
	}
}
