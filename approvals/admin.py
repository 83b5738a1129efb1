from django import forms
from django.contrib import admin

from accounts.admin_audit import AuditedAdmin, RecordOfTruthAdmin
from agentruns.money import format_amount, parse_amount
from approvals.models import Approval, ApprovalAuthority


@admin.display(description="amount", ordering="amount")
def _money(obj) -> str:
    # With its currency, never a bare count of minor units.
    return format_amount(obj.amount, obj.currency) if obj.amount is not None else "—"


@admin.register(Approval)
class ApprovalAdmin(RecordOfTruthAdmin):
    """Who allowed what: decided in the inbox (audited), used by the engine, never edited."""

    list_display = ["id", "tenant", "tool", "status", _money, "created_at", "expires_at"]
    list_filter = ["tenant", "status", "tool"]
    search_fields = ["=id", "effect_key", "requested_by", "decided_by_name"]


class ApprovalAuthorityForm(forms.ModelForm):
    """The limit typed as an amount in the row's currency ("500.00"), not minor units."""

    up_to = forms.CharField(
        required=False,
        label="Up to",
        help_text="An amount in the currency above, e.g. 500.00. Blank: any amount.",
    )

    class Meta:
        model = ApprovalAuthority
        fields = ["tenant", "group", "currency"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None and self.instance.max_amount is not None:
            amount = format_amount(self.instance.max_amount, self.instance.currency)
            self.fields["up_to"].initial = amount.rsplit(" ", 1)[0].replace(",", "")

    def clean(self):
        cleaned = super().clean()
        currency = cleaned.get("currency")
        if currency:
            try:
                self.instance.max_amount = parse_amount(cleaned.get("up_to", ""), currency)
            except ValueError as exc:
                self.add_error("up_to", str(exc))
        return cleaned


@admin.register(ApprovalAuthority)
class ApprovalAuthorityAdmin(AuditedAdmin):
    """A limit per role, tenant and currency: no row for a currency, no authority in it."""

    form = ApprovalAuthorityForm
    list_display = ["tenant", "group", "currency", "limit"]
    list_filter = ["tenant", "currency"]
    fields = ["tenant", "group", "currency", "up_to"]

    @admin.display(description="limit", ordering="max_amount")
    def limit(self, obj) -> str:
        if obj.max_amount is None:
            return f"any amount in {obj.currency.upper()}"
        return format_amount(obj.max_amount, obj.currency)
