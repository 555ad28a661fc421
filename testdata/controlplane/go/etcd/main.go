// etcd 3.6, the server kube-apiserver stores into, for the tests' control plane. A module of its
// own: k8s.io/kubernetes requires a newer etcd client, which would pull the server along.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
