// kube-apiserver, built from the k8s.io/kubernetes module at the version go.mod pins, for the
// tests' control plane (testdata/controlplane).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
