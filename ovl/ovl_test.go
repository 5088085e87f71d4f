package ovl

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestDataEscapesSeparators(t *testing.T) {
	c := Config{
		Lower:   []string{"/a:b", "/c,d"},
		Upper:   `/u\x`,
		Work:    "/w",
		Options: []string{"index=off", "strict_upper"},
	}
	got := c.Data()
	want := `lowerdir=/a\:b:/c\,d,upperdir=/u\\x,workdir=/w,index=off,strict_upper`
	if got != want {
		t.Fatalf("Data() = %q, want %q", got, want)
	}
	if c.dataLen() != len(got) {
		t.Fatalf("dataLen() = %d, len(Data()) = %d", c.dataLen(), len(got))
	}
}

func TestDataReadOnly(t *testing.T) {
	c := Config{Lower: []string{"/l1", "/l2"}}
	if got, want := c.Data(), "lowerdir=/l1:/l2"; got != want {
		t.Fatalf("Data() = %q, want %q", got, want)
	}
}

func TestValidate(t *testing.T) {
	many := make([]string, MaxLowers+1)
	for i := range many {
		many[i] = fmt.Sprintf("/l%d", i)
	}
	for _, tc := range []struct {
		name string
		c    Config
		ok   bool
	}{
		{"no lower", Config{Upper: "/u", Work: "/w"}, false},
		{"upper without work", Config{Lower: []string{"/l"}, Upper: "/u"}, false},
		{"ro single lower", Config{Lower: []string{"/l"}}, false},
		{"ro two lowers", Config{Lower: []string{"/l", "/m"}}, true},
		{"rw one lower", Config{Lower: []string{"/l"}, Upper: "/u", Work: "/w"}, true},
		{"comma in option", Config{Lower: []string{"/l", "/m"}, Options: []string{"a,b"}}, false},
		{"501 lowers", Config{Lower: many, Upper: "/u", Work: "/w"}, false},
		{"500 lowers", Config{Lower: many[:MaxLowers], Upper: "/u", Work: "/w"}, true},
	} {
		err := tc.c.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: Validate() = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	err := Config{Lower: many, Upper: "/u", Work: "/w"}.Validate()
	if !errors.Is(err, ErrTooManyLowers) {
		t.Errorf("501 lowers: error %v is not ErrTooManyLowers", err)
	}
}

func TestFitsPageOffByOne(t *testing.T) {
	// The kernel needs the NUL inside the page: 4095 bytes fit, 4096 do not.
	if !FitsPage(4095, 4096) {
		t.Error("4095 bytes must fit a 4096-byte page")
	}
	if FitsPage(4096, 4096) {
		t.Error("4096 bytes must not fit a 4096-byte page")
	}
}

// lowersOfLen returns n lower paths below base whose absolute form makes
// the data exactly size bytes long, by padding the last one.
func TestLegacyPlanBoundary(t *testing.T) {
	base := "/" + strings.Repeat("h", 200)
	mk := func(n int) Config {
		c := Config{Base: base + "/l", Upper: base + "/layers/x/diff", Work: base + "/layers/x/work"}
		for i := 0; i < n; i++ {
			c.Lower = append(c.Lower, fmt.Sprintf("%s/l/%06d", base, i))
		}
		return c
	}
	p, err := mk(2).LegacyPlan(4096)
	if err != nil || p.Dir != "" {
		t.Fatalf("2 lowers: plan %+v, %v; want absolute", p, err)
	}
	p, err = mk(500).LegacyPlan(4096)
	if err != nil {
		t.Fatalf("500 lowers: %v", err)
	}
	if p.Dir != base+"/l" {
		t.Fatalf("500 lowers: mount from %q, want %q", p.Dir, base+"/l")
	}
	if !strings.HasPrefix(p.Data, "lowerdir=000000:000001:") || !strings.Contains(p.Data, ",upperdir=../layers/x/diff,workdir=../layers/x/work") {
		t.Fatalf("500 lowers: relative data %.120q...", p.Data)
	}
	if len(p.Data) > 4095 {
		t.Fatalf("relative data is %d bytes", len(p.Data))
	}
	c := mk(500)
	c.Base = ""
	if _, err := c.LegacyPlan(4096); !errors.Is(err, ErrDataTooLong) {
		t.Fatalf("500 absolute lowers without base: %v, want ErrDataTooLong", err)
	}
}

// The exact boundary: data of 4095 bytes mounts with absolute paths, 4096
// bytes needs the relative form.
func TestLegacyPlanExactPage(t *testing.T) {
	for _, tc := range []struct {
		size    int
		wantDir bool
	}{{4095, false}, {4096, true}} {
		prefix := "lowerdir=/a:/"
		pad := tc.size - len(prefix)
		c := Config{Lower: []string{"/a", "/" + strings.Repeat("b", pad)}, Base: "/"}
		if n := len(c.Data()); n != tc.size {
			t.Fatalf("constructed %d bytes, want %d", n, tc.size)
		}
		p, err := c.LegacyPlan(4096)
		if err != nil {
			t.Fatalf("%d bytes: %v", tc.size, err)
		}
		if (p.Dir != "") != tc.wantDir {
			t.Errorf("%d bytes: plan dir %q, want relative=%v", tc.size, p.Dir, tc.wantDir)
		}
	}
}

func TestMounterMethod(t *testing.T) {
	c := Config{Lower: []string{"/l"}, Upper: "/u", Work: "/w"}
	if m, err := (Mounter{PageSize: 4096}).Method(c); err != nil || m != "absolute" {
		t.Errorf("legacy: %q, %v", m, err)
	}
	if m, err := (Mounter{LowerdirPlus: true}).Method(c); err != nil || m != "fsconfig" {
		t.Errorf("fsconfig: %q, %v", m, err)
	}
	if _, err := (Mounter{}).Method(Config{}); err == nil {
		t.Error("empty config accepted")
	}
}

func TestXattrNames(t *testing.T) {
	if got := Trusted.Name(XattrOpaque); got != "trusted.overlay.opaque" {
		t.Errorf("trusted opaque = %q", got)
	}
	if got := User.Name(XattrWhiteout); got != "user.overlay.whiteout" {
		t.Errorf("user whiteout = %q", got)
	}
	for name, want := range map[string]bool{
		"trusted.overlay.redirect": true,
		"user.overlay.metacopy":    true,
		"trusted.overlayx":         false,
		"security.capability":      false,
		"user.other":               false,
	} {
		if got := IsPrivate(name); got != want {
			t.Errorf("IsPrivate(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestSupportsDTypeOnTempDir(t *testing.T) {
	// The host's temporary directory is on a filesystem with d_type
	// (tmpfs or ext4): the raw getdents parsing must find the file type.
	ok, err := SupportsDType(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Error("d_type not reported on the test's temporary directory")
	}
}

func TestDirentTypeMalformed(t *testing.T) {
	if _, ok := direntType(make([]byte, 30), "f"); ok {
		t.Error("zero reclen record parsed")
	}
}

func TestFeaturesUsableAndOptions(t *testing.T) {
	f := Features{DType: false, Notes: map[string]string{}}
	if err := f.Usable(); err == nil || !strings.Contains(err.Error(), "d_type") {
		t.Errorf("no d_type: %v", err)
	}
	f = Features{DType: true, Notes: map[string]string{"whiteouts": "mknod: operation not permitted"}}
	if err := f.Usable(); err == nil || !strings.Contains(err.Error(), "whiteouts (0/0 character devices): mknod") {
		t.Errorf("no whiteouts: %v", err)
	}
	f = Features{DType: true, Whiteouts: true, Overlay: true, MultiLower: true, IndexParam: true, StrictUpper: true}
	if err := f.Usable(); err != nil {
		t.Errorf("usable: %v", err)
	}
	if got := strings.Join(f.BaseOptions(), ","); got != "index=off,strict_upper" {
		t.Errorf("base options %q", got)
	}
	miss := strings.Join(Features{DType: true, Notes: map[string]string{"overlay": "ENODEV"}}.Missing(), ";")
	if !strings.Contains(miss, "overlay (ENODEV)") || !strings.Contains(miss, "strict_upper") {
		t.Errorf("missing %q", miss)
	}
}

func TestOptionList(t *testing.T) {
	c := Config{Lower: []string{"/l/A", "/l/b,c"}, Upper: "/u", Work: "/w", Options: []string{"index=off", "redirect_dir=on"}}
	got := strings.Join(c.OptionList(false), "|")
	want := `lowerdir=/l/A:/l/b\,c|upperdir=/u|workdir=/w|index=off|redirect_dir=on`
	if got != want {
		t.Errorf("writable:\n got %s\nwant %s", got, want)
	}
	ro := Config{Lower: []string{"/l/A", "/e"}, NoSuid: true, NoDev: true}
	got = strings.Join(ro.OptionList(true), "|")
	if want := "lowerdir=/l/A:/e|ro|nosuid|nodev"; got != want {
		t.Errorf("read-only:\n got %s\nwant %s", got, want)
	}
	// The list joined with commas is the legacy data plus the flags.
	if j := strings.Join(c.OptionList(false), ","); j != c.Data() {
		t.Errorf("joined list %q differs from Data %q", j, c.Data())
	}
}
