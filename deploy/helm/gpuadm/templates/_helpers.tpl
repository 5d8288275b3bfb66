{{/*
Object names are fixed, not derived from the release name: gpuadm looks up its ConfigMaps
(gpuadm-policy, gpuadm-quotas), its Secret (gpuadm-tls) and its webhook configurations
(gpuadm) by these names, and the webhook configurations are cluster-wide, so a cluster runs
one gpuadm.
*/}}

{{- define "gpuadm.selectorLabels" -}}
app.kubernetes.io/name: gpuadm
{{- end }}

{{- define "gpuadm.labels" -}}
{{ include "gpuadm.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
The labels of the uninstall hook's Job and pod (uninstall-hook.yaml): gpuadm's, under another
name, so that neither the Service, the PodDisruptionBudget nor the NetworkPolicy of the
replicas selects the pod.
*/}}
{{- define "gpuadm.uninstallLabels" -}}
app.kubernetes.io/name: gpuadm-uninstall
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
The labels of the config check's Job, pod and ConfigMap (config-check.yaml): gpuadm's, under
another name, so that nothing of the replicas' selects them.
*/}}
{{- define "gpuadm.configCheckLabels" -}}
app.kubernetes.io/name: gpuadm-config-check
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/*
The annotations of what the uninstall Job needs made before it (its account, roles and
NetworkPolicy): pre-delete hooks of a lower weight than the Job's, replaced at each attempt,
and deleted once the Job has succeeded.
*/}}
{{- define "gpuadm.uninstallPrerequisiteHook" -}}
helm.sh/hook: pre-delete
helm.sh/hook-weight: "-10"
helm.sh/hook-delete-policy: before-hook-creation,hook-succeeded
{{- end }}

{{/*
terminationGracePeriodSeconds, refused unless a stopping replica's drain fits in it: the
shutdown delay, then the reviews still in flight (each answered within the webhook timeout),
then 5 s to close, before the kubelet's SIGKILL cuts a pod create short.
*/}}
{{- define "gpuadm.terminationGracePeriodSeconds" -}}
{{- $delay := int .Values.shutdownDelaySeconds -}}
{{- $timeout := int .Values.webhook.timeoutSeconds -}}
{{- $grace := int .Values.terminationGracePeriodSeconds -}}
{{- $needed := add $delay $timeout 5 -}}
{{- if lt $grace $needed }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must be at least shutdownDelaySeconds (%d) + webhook.timeoutSeconds (%d) + 5 = %d: a stopping replica drains, then answers the reviews in flight, before the kubelet kills it" $grace $delay $timeout $needed) }}
{{- end }}
{{- $grace -}}
{{- end }}

{{/*
The Secret the pods serve, mounted, when something else keeps it: cert-manager's gpuadm-tls,
or the admin's tls.existingSecret. Empty when gpuadm keeps its own TLS (serve --manage-tls).
*/}}
{{- define "gpuadm.mountedSecret" -}}
{{- if and .Values.certManager.enabled .Values.tls.existingSecret }}
{{- fail "certManager.enabled and tls.existingSecret both name who keeps the serving certificate: set one" }}
{{- end }}
{{- if .Values.certManager.enabled }}gpuadm-tls{{ else }}{{ .Values.tls.existingSecret }}{{ end }}
{{- end }}

{{/*
tls.caBundle, the CA of tls.existingSecret, for the caBundle of every webhook of both
configurations; empty when unset. Refused without tls.existingSecret, where gpuadm or
cert-manager's CA injector writes the caBundle and a value of the chart's would fight it.
*/}}
{{- define "gpuadm.caBundle" -}}
{{- with .Values.tls.caBundle }}
{{- if not $.Values.tls.existingSecret }}
{{- fail "tls.caBundle is the CA of tls.existingSecret, and is set only with it: otherwise gpuadm, or cert-manager's CA injector, writes the caBundle" }}
{{- end }}
{{- if not (contains "-----BEGIN CERTIFICATE-----" (b64dec .)) }}
{{- fail "tls.caBundle is not the base64 of a PEM certificate: give the output of base64 -w0 < ca.crt" }}
{{- end }}
{{- . }}
{{- end }}
{{- end }}

{{/* Non-empty when gpuadm keeps its own TLS: the Secret gpuadm-tls and the caBundles. */}}
{{- define "gpuadm.managesTls" -}}
{{- if not (include "gpuadm.mountedSecret" .) }}true{{ end }}
{{- end }}

{{/*
The data of a ConfigMap whose config the values give as text: the one key gpuadm reads
(policy.yaml, quotas.yaml), holding the text as it is. Helm never merges a text, so it is
exactly what the admin wrote. Called with (list "policy" TEXT) or (list "quotas" TEXT).
*/}}
{{- define "gpuadm.configText" -}}
{{- $name := index . 0 -}}
{{- $text := index . 1 -}}
{{- $none := ternary "`classes: {}` for no classes" "`namespaces: {}` for no quotas at all" (eq $name "policy") }}
{{- $given := ternary "an empty text" (printf "%s, neither keys nor a text" (toJson $text)) (kindIs "string" $text) }}
{{- if or (not (kindIs "string" $text)) (not (trim (toString $text))) }}
{{- fail (printf "%s is %s: give %s.yaml as its keys or as its text (%s)" $name $given $name $none) }}
{{- end }}
{{- toYaml (dict (printf "%s.yaml" $name) $text) }}
{{- end }}

{{/*
The data of the ConfigMap gpuadm-policy, and of the check Job's (config-check.yaml): from the
values' keys, with the release namespace added to exemptNamespaces, or their text as it is.
*/}}
{{- define "gpuadm.policyData" -}}
{{- if kindIs "map" .Values.policy -}}
# The values' policy, with the release namespace added to exemptNamespaces.
{{- $policy := merge (dict "exemptNamespaces" (include "gpuadm.exemptNamespaces" . | fromJsonArray)) .Values.policy }}
policy.yaml: |
  {{- toYaml $policy | nindent 2 }}
{{- else -}}
# The values' policy text, as it is.
{{ include "gpuadm.configText" (list "policy" .Values.policy) }}
{{- end }}
{{- end }}

{{/* The data of the ConfigMap gpuadm-quotas, and of the check Job's, as gpuadm.policyData. */}}
{{- define "gpuadm.quotasData" -}}
{{- if kindIs "map" .Values.quotas -}}
quotas.yaml: |
  {{- toYaml .Values.quotas | nindent 2 }}
{{- else -}}
# The values' quotas text, as it is.
{{ include "gpuadm.configText" (list "quotas" .Values.quotas) }}
{{- end }}
{{- end }}

{{/*
The policy as JSON, from its keys or its text, for what the chart reads of it: the domain and
exemptNamespaces. gpuadm checks the rest.
*/}}
{{- define "gpuadm.policy" -}}
{{- $policy := .Values.policy -}}
{{- if kindIs "string" $policy }}
{{- $policy = fromYaml $policy }}
{{- if hasKey $policy "Error" }}
{{- fail (printf "policy: the text is not a YAML mapping of policy.yaml's keys: %s" $policy.Error) }}
{{- end }}
{{- end }}
{{- toJson $policy -}}
{{- end }}

{{/* The prefix of gpuadm's own keys: policy.domain, as gpuadm reads it. */}}
{{- define "gpuadm.domain" -}}
{{- (include "gpuadm.policy" . | fromJson).domain | default "gpuadm.io" -}}
{{- end }}

{{/*
The policy's exemptNamespaces, with the release namespace: what gpuadm leaves alone.
*/}}
{{- define "gpuadm.exemptNamespaces" -}}
{{- $exempt := (include "gpuadm.policy" . | fromJson).exemptNamespaces | default list -}}
{{- if not (kindIs "slice" $exempt) }}
{{- fail (printf "policy.exemptNamespaces: %v is not a list of namespaces" $exempt) }}
{{- end }}
{{- concat $exempt (list .Release.Namespace) | uniq | toJson -}}
{{- end }}

{{/*
namespaceSelector of both webhooks: never the excluded namespaces, the namespaces the policy
exempts, nor gpuadm's own; and only the namespaces of webhook.onlyNamespaces when it is set.
*/}}
{{- define "gpuadm.namespaceSelector" -}}
{{- $exempt := include "gpuadm.exemptNamespaces" . | fromJsonArray -}}
{{- $never := concat .Values.webhook.excludedNamespaces $exempt | uniq -}}
{{- with .Values.webhook.onlyNamespaces }}
{{- range . }}
{{- if has . $never }}
{{- fail (printf "webhook.onlyNamespaces: %q is never sent to gpuadm (webhook.excludedNamespaces, policy.exemptNamespaces or the release namespace)" .) }}
{{- end }}
{{- end -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: In
    values: {{ toJson . }}
{{- else -}}
matchExpressions:
  - key: kubernetes.io/metadata.name
    operator: NotIn
    values: {{ toJson $never }}
{{- end }}
{{- end }}

{{/*
A CEL string literal of a resource name. The names go into an expression verbatim, so one
that is not a valid resource name (a quote, a space) is refused here rather than by the
apiserver at install time.
*/}}
{{- define "gpuadm.celResourceName" -}}
{{- if not (regexMatch "^[A-Za-z0-9][-A-Za-z0-9_./]*$" .) }}
{{- fail (printf "gpuResources: %q is not a resource name or prefix" .) }}
{{- end }}
{{- squote . }}
{{- end }}

{{/*
CEL, true when a pod concerns gpuadm: any container or init container names a GPU resource in
its limits or requests (a key under one of the prefixes, or one of the names, built from
gpuResources and policy.domain so that the list lives in values.yaml only), or the pod reaches
GPUs another way that the policy's guard denies: NVIDIA_VISIBLE_DEVICES in any container, a
mount whose path names nvidia-container-devices, or a hostPath under /dev/nvidia or of a
directory that holds the device files (/dev/char, /run/nvidia/driver/dev, a directory above
them) however spelt (policies/access/guard/).
*/}}
{{- define "gpuadm.concernsGpuadm" -}}
{{- $prefixes := concat (list (printf "%s/" (include "gpuadm.domain" .))) .Values.gpuResources.prefixes .Values.gpuResources.extraPrefixes | uniq -}}
{{- $names := concat .Values.gpuResources.names .Values.gpuResources.extraNames | uniq -}}
object != null && has(object.spec) && (
  (has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0) ||
  (
    (has(object.spec.containers) ? object.spec.containers : []) +
    (has(object.spec.initContainers) ? object.spec.initContainers : [])
  ).exists(c, has(c.resources) && (
    (has(c.resources.limits) ? c.resources.limits.map(k, k) : []) +
    (has(c.resources.requests) ? c.resources.requests.map(k, k) : [])
  ).exists(k,
{{- range $prefixes }}
    k.startsWith({{ include "gpuadm.celResourceName" . }}) ||
{{- end }}
    k in [
{{- range $i, $name := $names }}
      {{ include "gpuadm.celResourceName" $name }}{{ if lt $i (sub (len $names) 1) }},{{ end }}
{{- end }}
    ]
  )) ||
  (
    (has(object.spec.containers) ? object.spec.containers : []) +
    (has(object.spec.initContainers) ? object.spec.initContainers : []) +
    (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])
  ).exists(c, has(c.env) && c.env.exists(e,
    has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES'
  )) ||
  (
    (has(object.spec.containers) ? object.spec.containers : []) +
    (has(object.spec.initContainers) ? object.spec.initContainers : []) +
    (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers : [])
  ).exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m,
    has(m.mountPath) && m.mountPath.contains('nvidia-container-devices')
  )) ||
  (has(object.spec.volumes) ? object.spec.volumes : []).exists(v,
    has(v.hostPath) && has(v.hostPath.path) &&
    (
      v.hostPath.path.matches('^(\\.?/+)*dev/+(\\.?/+)*nvidia') ||
      v.hostPath.path.matches('^(\\.?/+)*(\\.?|(dev(/+(\\.?/+)*char(/.*)?)?|(var/+(\\.?/+)*)?run(/+(\\.?/+)*nvidia(/+(\\.?/+)*driver(/+(\\.?/+)*dev(/.*)?)?)?)?)(/+\\.?)*)$')
    )
  )
)
{{- end }}

{{/*
CEL, true when the old or the new pod has a label or annotation under policy.domain; or one
of the annotations with which a pod chooses its devices or HAMi's GPU policy
(DEVICE_CHOICE_ANNOTATIONS and PLACEMENT_ANNOTATIONS in policies/classes/models.py), or
KAI's share annotations (ROUTED_REQUEST_ANNOTATIONS in policies/policy.py): only gpuadm
writes them; or one of those with which the stacks' schedulers and KAI's binder record what
they allocated (ALLOCATION_ANNOTATIONS, KAI_ALLOCATION_ANNOTATIONS and KAI_GPU_GROUP in
policies/access/guard/): only the GPU stack writes them.
*/}}
{{- define "gpuadm.touchesGpuadmKeys" -}}
{{- $prefix := printf "%s/" (include "gpuadm.domain" .) | squote -}}
[object, oldObject].exists(o, o != null && has(o.metadata) && (
  (has(o.metadata.labels) && o.metadata.labels.exists(k,
    k.startsWith({{ $prefix }}) || k == 'runai-gpu-group' || k.startsWith('runai-gpu-group/')
  )) ||
  (has(o.metadata.annotations) && o.metadata.annotations.exists(k,
    k.startsWith({{ $prefix }}) ||
    k in [
      'nvidia.com/use-gputype',
      'nvidia.com/nouse-gputype',
      'nvidia.com/use-gpuuuid',
      'nvidia.com/nouse-gpuuuid',
      'nvidia.com/vgpu-mode',
      'volcano.sh/vgpu-mode',
      'hami.io/gpu-scheduler-policy',
      'hami.io/vgpu-devices-to-allocate',
      'hami.io/vgpu-devices-allocated',
      'hami.io/vgpu-mig-allocations',
      'hami.io/vgpu-node',
      'hami.io/vgpu-time',
      'hami.io/bind-phase',
      'hami.io/bind-time',
      'volcano.sh/devices-to-allocate',
      'volcano.sh/vgpu-ids-new',
      'volcano.sh/vgpu-node',
      'volcano.sh/vgpu-time',
      'volcano.sh/bind-phase',
      'volcano.sh/bind-time',
      'gpu-fraction',
      'gpu-memory',
      'gpu-fraction-num-devices',
      'gpu-fraction-container-name',
      'received-resource-type'
    ]
  )) ||
  (has(o.spec) && has(o.spec.schedulingGates) && o.spec.schedulingGates.exists(g,
    has(g.name) && g.name.startsWith({{ $prefix }})
  ))
))
{{- end }}

{{/*
The image reference: by digest when one is given (the tag then only labels it), else by tag.
*/}}
{{- define "gpuadm.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end }}

{{/*
The egress rule to the apiserver, for the replicas' NetworkPolicy and the uninstall Job's.
Policies see the endpoint after the Service's address is translated, so these are its real
ports (networkPolicy.apiserverPorts): 6443 on most clusters, 443 on some managed ones, 16443
on MicroK8s. It has no pod to select either, hence no `to:`. A rule without ports would allow
every port, so none is refused.
*/}}
{{- define "gpuadm.apiserverEgress" -}}
{{- if not .Values.networkPolicy.apiserverPorts }}
{{- fail "networkPolicy.apiserverPorts: list the apiserver's ports, e.g. [443, 6443]; none would open every port" }}
{{- end -}}
- ports:
    {{- range .Values.networkPolicy.apiserverPorts }}
    - port: {{ . }}
      protocol: TCP
    {{- end }}
{{- end }}
