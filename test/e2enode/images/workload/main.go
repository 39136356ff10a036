// Command workload is the e2enode tests' pod program, in the image they import:
//
//	workload serve            HTTP on :8080 (any path answers 200 "ok <hostname>"; the
//	                          kubelet's probes use /healthz) and a UDP echo on :8081
//	workload connect tcp|udp ADDR:PORT
//	                          one TCP connection (or one UDP datagram and its echo) with
//	                          a 1 s timeout; prints "ok" and exits 0, else the error, exit 1
//	workload watch tcp|udp ADDR:PORT SECONDS
//	                          connect every 100 ms (500 ms timeout) for SECONDS; prints one
//	                          line per attempt that differs from the one before ("+T ok",
//	                          "+T fail: err", T in ms since the start) and a last line
//	                          "ok=N fail=M"; exits 0
//
// The tests run connect in a pod through the kubelet's exec, so traffic between pods
// leaves one pod's veth and enters the other's, as any pod's would.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: workload serve | workload connect tcp|udp ADDR:PORT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "serve":
		serve()
	case "connect":
		if len(os.Args) != 4 {
			fmt.Fprintln(os.Stderr, "usage: workload connect tcp|udp ADDR:PORT")
			os.Exit(2)
		}
		if err := connect(os.Args[2], os.Args[3]); err != nil {
			fmt.Println("fail:", err)
			os.Exit(1)
		}
		fmt.Println("ok")
	case "watch":
		if len(os.Args) != 5 {
			fmt.Fprintln(os.Stderr, "usage: workload watch tcp|udp ADDR:PORT SECONDS")
			os.Exit(2)
		}
		secs, err := strconv.Atoi(os.Args[4])
		if err != nil {
			fmt.Fprintln(os.Stderr, "SECONDS:", err)
			os.Exit(2)
		}
		watchConnect(os.Args[2], os.Args[3], time.Duration(secs)*time.Second)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func serve() {
	host, _ := os.Hostname()
	pc, err := net.ListenPacket("udp", ":8081")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, addr, err := pc.ReadFrom(buf)
			if err != nil {
				continue
			}
			_, _ = pc.WriteTo(buf[:n], addr)
		}
	}()
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok %s\n", host)
	})
	fmt.Fprintln(os.Stderr, http.ListenAndServe(":8080", nil))
	os.Exit(1)
}

func connect(proto, addr string) error { return connectTimeout(proto, addr, time.Second) }

// watchConnect connects to addr every 100 ms for d, printing each change of outcome
// and the totals: what a test reads to show traffic was judged the same throughout.
func watchConnect(proto, addr string, d time.Duration) {
	start := time.Now()
	var ok, fail int
	last := ""
	for time.Since(start) < d {
		t := time.Now()
		outcome := "ok"
		if err := connectTimeout(proto, addr, 500*time.Millisecond); err != nil {
			outcome = "fail: " + err.Error()
			fail++
		} else {
			ok++
		}
		if kind := outcome[:2]; kind != last {
			fmt.Printf("+%d %s\n", t.Sub(start).Milliseconds(), outcome)
			last = kind
		}
		time.Sleep(time.Until(t.Add(100 * time.Millisecond)))
	}
	fmt.Printf("ok=%d fail=%d\n", ok, fail)
}

func connectTimeout(proto, addr string, timeout time.Duration) error {
	switch proto {
	case "tcp":
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return err
		}
		return c.Close()
	case "udp":
		c, err := net.DialTimeout("udp", addr, timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:n]) != "ping" {
			return fmt.Errorf("echo %q", buf[:n])
		}
		return nil
	}
	return fmt.Errorf("protocol %q: want tcp or udp", proto)
}
