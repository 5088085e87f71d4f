package main

import (
	"strconv"
	"strings"
	"testing"
)

func TestMedians(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"output","Test":"BenchmarkA/x","Output":"BenchmarkA/x         \t"}`,
		`{"Action":"output","Test":"BenchmarkA/x","Output":"       1\t 300 ns/op\t  10.00 MB/s\n"}`,
		`{"Action":"output","Test":"BenchmarkA/x","Output":"BenchmarkA/x   \t       1\t 100 ns/op\t  30.00 MB/s\n"}`,
		`BenchmarkA/x-2   	       1	 200 ns/op	  20.00 MB/s`,
		`{"Action":"output","Test":"BenchmarkB","Output":"BenchmarkB \t 1\t 5 ns/op\t 7 create-ns\n"}`,
		`{"Action":"output","Test":"BenchmarkB","Output":"BenchmarkB \t 1\t 9 ns/op\t 3 create-ns\n"}`,
		`not a benchmark line`,
		`{"Action":"pass","Test":"BenchmarkB"}`,
	}, "\n")
	rows, err := medians(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.name+" "+r.unit+" "+strings.TrimSpace(strings.Join([]string{ftoa(r.median), itoa(r.runs), ftoa(r.min), ftoa(r.max)}, " ")))
	}
	want := []string{
		"BenchmarkA/x ns/op 200 3 100 300",
		"BenchmarkA/x MB/s 20 3 10 30",
		"BenchmarkB ns/op 7 2 5 9",
		"BenchmarkB create-ns 5 2 3 7",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func itoa(i int) string { return strconv.Itoa(i) }
