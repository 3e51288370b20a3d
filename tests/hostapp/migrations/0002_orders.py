from __future__ import annotations

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("hostapp", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("status", models.CharField(
                    choices=[("paid", "Paid"), ("shipped", "Shipped"),
                             ("delivered", "Delivered")],
                    default="paid", max_length=20)),
                ("total_cents", models.PositiveIntegerField()),
                ("customer", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                               to=settings.AUTH_USER_MODEL)),
            ],
        ),
        migrations.CreateModel(
            name="Refund",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True,
                                           serialize=False, verbose_name="ID")),
                ("tool_call_id", models.UUIDField(unique=True)),
                ("reason", models.CharField(max_length=20)),
                ("cents", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("order", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE,
                                            related_name="refunds", to="hostapp.order")),
            ],
        ),
    ]
