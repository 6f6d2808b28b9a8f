#!/usr/bin/env bash
# meshd end to end on a kind cluster, for machines with Docker (CI's have none; see
# e2e/README.md). Needs docker, kind, kubectl and helm on PATH.
#
#   1. a kind cluster; meshd's two images built from docker/ and loaded into it;
#   2. the chart installed (operator, CRDs); two revisions, `stable` and `canary`, and a
#      tag `prod` pointing at `stable`;
#   3. the Bookinfo-like app (app.yaml) in namespace `shop`, labelled istio.io/rev=prod:
#      every pod gets the sidecar; STRICT mTLS; routing sends reviews to v2 only;
#   4. the canary move: the tag to `canary`, the app restarted onto it, `stable` removed;
#   5. uninstall, leaving nothing of meshd behind; the cluster deleted (KEEP=1 keeps it).
set -euo pipefail
cd "$(dirname "$0")/../.."
cluster="${CLUSTER:-meshd-e2e}"
hub="${HUB:-localhost/meshd}"
tag="${TAG:-dev}"
ns=istio-system

step() { printf '\n== %s\n' "$*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
for tool in docker kind kubectl helm; do
    command -v "$tool" >/dev/null || fail "$tool is not on PATH"
done

step "kind cluster $cluster, images $hub/{meshd,proxy}:$tag"
kind get clusters | grep -qx "$cluster" || kind create cluster --name "$cluster"
docker build -f docker/meshd.Dockerfile -t "$hub/meshd:$tag" .
docker build -f docker/proxy.Dockerfile -t "$hub/proxy:$tag" .
kind load docker-image --name "$cluster" "$hub/meshd:$tag" "$hub/proxy:$tag"

step "the chart: operator and CRDs"
helm install meshd charts/meshd -n meshd-system --create-namespace \
    --set operator.image="$hub/meshd:$tag" --set operator.imagePullPolicy=Never --wait
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f -

revision() {
    kubectl apply -f - <<YAML
apiVersion: operator.meshd.io/v1alpha1
kind: MeshRevision
metadata: {name: $1}
spec:
  version: "$tag"
  namespace: $ns
  values:
    global: {hub: $hub}
YAML
}
wait_ready() {
    kubectl -n "$ns" rollout status "deployment/istiod-$1" --timeout=180s
    kubectl wait "meshrevision/$1" --for=condition=Ready --timeout=120s
}
point_tag() {
    kubectl apply -f - <<YAML
apiVersion: operator.meshd.io/v1alpha1
kind: MeshRevisionTag
metadata: {name: prod}
spec:
  targetRef: {kind: MeshRevision, name: $1}
YAML
    kubectl wait meshrevisiontag/prod --for=jsonpath='{.status.revision}'="$1" --timeout=60s
}

step "revisions stable and canary, tag prod -> stable"
revision stable
revision canary
wait_ready stable
wait_ready canary
point_tag stable

step "the app in shop, injected by the tag's revision"
kubectl create namespace shop --dry-run=client -o yaml | kubectl apply -f -
kubectl label namespace shop istio.io/rev=prod --overwrite
kubectl -n shop apply -f e2e/kind/app.yaml
kubectl -n shop rollout status deployment --timeout=180s
check_app() {
    local revision="$1"
    for pod in $(kubectl -n shop get pods -o name); do
        got="$(kubectl -n shop get "$pod" -o jsonpath='{.metadata.annotations.istio\.io/rev}')"
        [ "$got" = "$revision" ] || fail "$pod is on revision '$got', not $revision"
    done
    caller="$(kubectl -n shop get pod -l app=productpage -o name | head -1)"
    for _ in $(seq 10); do
        body="$(kubectl -n shop exec "$caller" -c productpage -- curl -s http://reviews:9080/)"
        [ "$body" = "reviews-v2" ] || fail "routing: reviews answered '$body', not reviews-v2"
    done
    # STRICT mTLS: a caller without a sidecar is refused.
    kubectl -n default run plain --rm -i --restart=Never --image=docker.io/curlimages/curl:8.11.1 \
        -- curl -s -m 5 http://reviews.shop:9080/ && fail "a plaintext caller got through STRICT mTLS"
    echo "app on $revision: routed to v2, mTLS strict"
}
check_app stable

step "canary move: tag prod -> canary, the app restarted onto it"
point_tag canary
kubectl -n shop rollout restart deployment
kubectl -n shop rollout status deployment --timeout=180s
check_app canary
kubectl delete meshrevision stable --wait --timeout=120s

step "uninstall"
kubectl delete namespace shop --wait --timeout=180s
kubectl delete meshrevisiontag prod --wait --timeout=60s
kubectl delete meshrevision canary --wait --timeout=120s
helm uninstall meshd -n meshd-system --wait
kubectl delete crd -l app.kubernetes.io/part-of=meshd
# The root certificate meshd published in every namespace, as istiod does: nothing owns
# those ConfigMaps (istiod's uninstall leaves them too), so they go by their label.
kubectl delete configmap -A -l istio.io/config=true
kubectl delete namespace "$ns" meshd-system --wait --timeout=180s
left="$(kubectl get mutatingwebhookconfigurations,validatingwebhookconfigurations,clusterroles,clusterrolebindings -o name | grep -E 'istio|meshd' || true)"
left="$left$(kubectl get configmaps -A -o name | grep -E 'istio' || true)"
[ -z "$left" ] || fail "left behind: $left"
echo "nothing of meshd is left"

[ "${KEEP:-0}" = 1 ] || kind delete cluster --name "$cluster"
step "passed"
