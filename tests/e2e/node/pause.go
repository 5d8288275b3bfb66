// The pause process of every pod sandbox on the test node: it holds the sandbox's
// namespaces and waits for the signal that ends the pod. Built with CGO_ENABLED=0, so the
// image needs nothing but this one static file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	<-signals
}
